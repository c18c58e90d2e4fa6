"""Each package has one error root that every error it raises on purpose derives from."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import accord
import accord_cassandra
import stacksaga_store
from accord import AccordError
from accord_cassandra import AccordCassandraError
from stacksaga_store import StackSagaError

# Not under the root on purpose: StepError is user code's to raise; SimulatedCrash and
# SimulatedCommitCrash are BaseException test hooks that must escape every handler. The other
# two are internal to modules other branches still change; they never reach a caller (each
# becomes a gRPC status).
OUTSIDE_THE_ROOT = {
    "stacksaga_store.errors.StepError",
    "stacksaga_store.errors.RetryableStepError",
    "stacksaga_store.errors.NonRetryableStepError",
    "stacksaga_store.recovery.commit_modes.SimulatedCrash",
    "stacksaga_store.store.accord_changes.SimulatedCommitCrash",
    "accord_cassandra.translate.RequestError",
    "accord_cassandra.host.Overloaded",
}


def _modules(package: ModuleType) -> list[ModuleType]:
    names = [package.__name__]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if ".v1" in info.name or info.name.endswith("__main__"):
            continue
        names.append(info.name)
    return [importlib.import_module(name) for name in names]


def _errors(package: ModuleType) -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in _modules(package):
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
                and not name.startswith("_")
            ):
                found[f"{module.__name__}.{name}"] = value
    return found


@pytest.mark.parametrize(
    ("package", "root"),
    [
        (accord, AccordError),
        (accord_cassandra, AccordCassandraError),
        (stacksaga_store, StackSagaError),
    ],
)
def test_every_public_error_derives_from_the_package_root(
    package: ModuleType, root: type[Exception]
) -> None:
    errors = _errors(package)
    assert len(errors) >= 4, errors  # the walk found the package's errors at all
    stray = sorted(name for name, error in errors.items() if not issubclass(error, root))
    assert set(stray) <= OUTSIDE_THE_ROOT, stray
    assert root.__name__ in package.__all__


def test_the_roots_keep_the_bases_callers_catch() -> None:
    from accord.invariants import InvalidArgument
    from accord_cassandra.client import TransactionError
    from accord_cassandra.config import ConfigError
    from accord_cassandra.ports import AddressInUse
    from stacksaga_store.errors import InvariantViolation

    assert issubclass(InvalidArgument, ValueError)
    assert issubclass(TransactionError, RuntimeError)
    assert issubclass(ConfigError, ValueError)
    assert issubclass(AddressInUse, OSError)
    assert issubclass(InvariantViolation, AssertionError)
    with pytest.raises(ValueError, match="is not in the topology"):
        accord.Node(9, accord.ring_topology([1, 2, 3], 3), None, None)  # type: ignore[arg-type]
