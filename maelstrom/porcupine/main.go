// Command porcupine-check is an independent linearizability check of a Maelstrom history,
// built on Porcupine (github.com/anishathalye/porcupine), which nobody on this project wrote.
//
// Usage: porcupine-check [-timeout 60s] [-max-heap-mb 2048] [-html out.html] history.json
//
// The history (written by maelstrom/porcupine_driver.py) names a model and lists operations
// with call and return times in nanoseconds; "return": null marks an unknown outcome (a
// Jepsen :info), which may take effect at any time after its call. Values are canonical
// JSON texts, compared as strings.
//
//   - cas-register: lin-kv, partitioned by key (Knossos' cas-register model).
//   - list-append, rw-register: the whole database is one object, so linearizability is
//     strict serializability of the transactions. Unknown-outcome transactions whose writes
//     no completed read observed are dropped first; with unique written values this is exact
//     (such a transaction can always be placed last) and avoids trying every subset of them.
//
// Prints {"result": "Ok"|"Illegal"|"Unknown", ...} and exits 0 (Ok), 1 (Illegal) or
// 2 (Unknown after -timeout or past -max-heap-mb, or an error).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"
)

type mop struct {
	F     string   `json:"f"`
	Key   string   `json:"key"`
	Value *string  `json:"value"`
	List  []string `json:"list"`
}

type op struct {
	Client int64   `json:"client"`
	Call   int64   `json:"call"`
	Return *int64  `json:"return"`
	F      string  `json:"f"`
	Key    string  `json:"key"`
	Value  *string `json:"value"`
	From   *string `json:"from"`
	To     *string `json:"to"`
	Txn    []mop   `json:"txn"`
	keys   []string
}

type history struct {
	Model      string `json:"model"`
	Operations []op   `json:"operations"`
}

// text is a canonical JSON value, or "" for none: canonical JSON is never the empty string,
// so "" doubles as the state of an absent register.
func text(value *string) string {
	if value == nil {
		return ""
	}
	return *value
}

var casRegister = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, o := range h {
			k := o.Input.(*op).Key
			if _, seen := byKey[k]; !seen {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], o)
		}
		parts := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, byKey[k])
		}
		return parts
	},
	Init: func() interface{} { return "" },
	Step: func(state, input, _ interface{}) (bool, interface{}) {
		guard()
		st, o := state.(string), input.(*op)
		unknown := o.Return == nil
		switch o.F {
		case "read":
			return unknown || st == text(o.Value), st
		case "write":
			return true, text(o.Value)
		default: // cas: an ok cas says the condition held; a failed one is not in the history
			if st == text(o.From) {
				return true, text(o.To)
			}
			return unknown, st
		}
	},
	DescribeOperation: func(input, _ interface{}) string {
		o := input.(*op)
		s := fmt.Sprintf("%s(%s)", o.F, o.Key)
		switch {
		case o.F == "cas":
			s += fmt.Sprintf(" %s->%s", text(o.From), text(o.To))
		case o.Value != nil:
			s += " " + text(o.Value)
		}
		if o.Return == nil {
			s += " ?"
		}
		return s
	},
}

// A database state holds, for each key that operations not yet linearized still touch,
// its value and how many of those operations there are ("live"). A key whose last
// operation has been linearized can never matter again, so it is dropped: states stay as
// small as the set of keys in play, and since live counts depend only on which operations
// are linearized, dropping keys loses no memoization. A register is its canonical JSON
// value ("" when absent); a list is its elements, each followed by \x1f (canonical JSON
// escapes control characters, so \x1f never occurs inside an element).
type cell struct {
	value string
	live  int
}

type db struct {
	cells map[string]cell
	hash  uint64
}

func cellHash(k string, c cell) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x1e%s\x1e%d", k, c.value, c.live)
	return h.Sum64()
}

func listText(elements []string) string {
	s := ""
	for _, e := range elements {
		s += e + "\x1f"
	}
	return s
}

// keysOf lists each key an operation touches once, in first-touch order.
func keysOf(o *op) []string {
	var keys []string
	seen := map[string]bool{}
	for _, m := range o.Txn {
		if !seen[m.Key] {
			seen[m.Key] = true
			keys = append(keys, m.Key)
		}
	}
	return keys
}

func database(ops []op, appendMode bool) porcupine.Model {
	touches := map[string]int{}
	for i := range ops {
		ops[i].keys = keysOf(&ops[i])
		for _, k := range ops[i].keys {
			touches[k]++
		}
	}
	return porcupine.Model{
		Init: func() interface{} { return &db{cells: map[string]cell{}} },
		Step: func(state, input, _ interface{}) (bool, interface{}) {
			guard()
			d, o := state.(*db), input.(*op)
			working := make(map[string]cell, len(o.keys))
			for _, k := range o.keys {
				c, ok := d.cells[k]
				if !ok {
					c = cell{"", touches[k]}
				}
				working[k] = c
			}
			for _, m := range o.Txn {
				c := working[m.Key]
				switch {
				case m.F != "r" && appendMode:
					c.value += text(m.Value) + "\x1f"
				case m.F != "r":
					c.value = text(m.Value)
				case o.Return == nil:
					continue // an unknown outcome observed nothing
				case appendMode && c.value != listText(m.List):
					return false, state
				case !appendMode && c.value != text(m.Value):
					return false, state
				}
				working[m.Key] = c
			}
			next := &db{cells: make(map[string]cell, len(d.cells)), hash: d.hash}
			for k, c := range d.cells {
				next.cells[k] = c
			}
			for k, c := range working {
				if old, ok := d.cells[k]; ok {
					next.hash -= cellHash(k, old)
					delete(next.cells, k)
				}
				if c.live--; c.live > 0 {
					next.cells[k] = c
					next.hash += cellHash(k, c)
				}
			}
			return true, next
		},
		Equal: func(a, b interface{}) bool {
			x, y := a.(*db), b.(*db)
			if x.hash != y.hash || len(x.cells) != len(y.cells) {
				return false
			}
			for k, c := range x.cells {
				if other, ok := y.cells[k]; !ok || other != c {
					return false
				}
			}
			return true
		},
		Hash: func(s interface{}) uint64 { return s.(*db).hash },
		DescribeOperation: func(input, _ interface{}) string {
			text, _ := json.Marshal(input.(*op).Txn)
			return string(text)
		},
	}
}

// guard ends the process with Unknown once the heap passes -max-heap-mb: Porcupine's
// cache has no bound of its own, and a history with many long, overlapping operations
// can need more memory than the machine has. Checked every 65536 steps, from any of
// the goroutines that check partitions in parallel.
var (
	steps         atomic.Int64
	heapLimit     uint64
	heapSample    = []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	heapSampleMux sync.Mutex
)

func guard() {
	if steps.Add(1)%65536 != 0 {
		return
	}
	heapSampleMux.Lock()
	defer heapSampleMux.Unlock()
	metrics.Read(heapSample)
	if used := heapSample[0].Value.Uint64(); used > heapLimit {
		out, _ := json.Marshal(map[string]interface{}{
			"result": "Unknown", "reason": fmt.Sprintf("heap of %d MiB passed -max-heap-mb", used>>20),
		})
		fmt.Println(string(out))
		os.Exit(2)
	}
}

// pruneUnobserved drops unknown-outcome txns whose writes no completed read saw.
func pruneUnobserved(ops []op) []op {
	seen := map[[2]string]bool{}
	for _, o := range ops {
		for _, m := range o.Txn {
			if o.Return != nil && m.F == "r" {
				for _, e := range m.List {
					seen[[2]string{m.Key, e}] = true
				}
				if m.Value != nil {
					seen[[2]string{m.Key, *m.Value}] = true
				}
			}
		}
	}
	kept := ops[:0:0]
	for _, o := range ops {
		observed := o.Return != nil
		for _, m := range o.Txn {
			observed = observed || (m.F != "r" && seen[[2]string{m.Key, text(m.Value)}])
		}
		if observed {
			kept = append(kept, o)
		}
	}
	return kept
}

func run() (porcupine.CheckResult, error) {
	timeout := flag.Duration("timeout", 60*time.Second, "give up (Unknown) after this long")
	html := flag.String("html", "", "write Porcupine's visualization here unless Ok")
	maxHeap := flag.Uint64("max-heap-mb", 2048, "give up (Unknown) when the heap passes this")
	flag.Parse()
	heapLimit = *maxHeap << 20
	if flag.NArg() != 1 {
		return porcupine.Unknown, fmt.Errorf("usage: porcupine-check [flags] history.json")
	}
	data, err := os.ReadFile(flag.Arg(0))
	if err != nil {
		return porcupine.Unknown, err
	}
	var h history
	if err := json.Unmarshal(data, &h); err != nil {
		return porcupine.Unknown, fmt.Errorf("bad history: %w", err)
	}
	var model porcupine.Model
	ops := h.Operations
	switch h.Model {
	case "cas-register":
		model = casRegister
	case "list-append", "rw-register":
		ops = pruneUnobserved(ops)
		model = database(ops, h.Model == "list-append")
	default:
		return porcupine.Unknown, fmt.Errorf("unknown model %q", h.Model)
	}
	clients := map[int64]int{}
	operations := make([]porcupine.Operation, 0, len(ops))
	for i := range ops {
		o := &ops[i]
		if _, ok := clients[o.Client]; !ok {
			clients[o.Client] = len(clients)
		}
		ret := int64(math.MaxInt64)
		if o.Return != nil {
			ret = *o.Return
		}
		operations = append(operations, porcupine.Operation{
			ClientId: clients[o.Client], Input: o, Call: o.Call, Output: o, Return: ret,
		})
	}
	started := time.Now()
	result := porcupine.CheckOperationsTimeout(model, operations, *timeout)
	out, _ := json.Marshal(map[string]interface{}{
		"result": result, "model": h.Model, "operations": len(operations),
		"pruned": len(h.Operations) - len(ops), "elapsed_ms": time.Since(started).Milliseconds(),
	})
	fmt.Println(string(out))
	if *html != "" && result == porcupine.Illegal {
		// The verbose check also records partial linearizations; only a failure needs them.
		_, info := porcupine.CheckOperationsVerbose(model, operations, *timeout)
		if err := porcupine.VisualizePath(model, info, *html); err != nil {
			return result, err
		}
	}
	return result, nil
}

func main() {
	result, err := run()
	if err != nil {
		out, _ := json.Marshal(map[string]string{"result": "Error", "error": err.Error()})
		fmt.Println(string(out))
		os.Exit(2)
	}
	switch result {
	case porcupine.Ok:
		os.Exit(0)
	case porcupine.Illegal:
		os.Exit(1)
	default:
		os.Exit(2)
	}
}
