"""The Trace Window: ``stacksaga-store console`` (docs/console.md)."""
