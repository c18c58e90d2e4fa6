// Command porcupine-check is an independent linearizability check of a Maelstrom history,
// built on Porcupine (github.com/anishathalye/porcupine), which nobody on this project wrote.
//
// Usage: porcupine-check [-timeout 60s] [-html out.html] history.json
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
// 2 (Unknown after -timeout, or an error).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"hash/fnv"
	"math"
	"os"
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

// A database state: key -> value (registers) or key -> elements each followed by \x1f
// (lists; canonical JSON escapes control characters, so \x1f never occurs inside one).
type db struct {
	values map[string]string
	hash   uint64
}

func cellHash(k, v string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(k))
	h.Write([]byte{0x1e})
	h.Write([]byte(v))
	return h.Sum64()
}

func (d *db) with(k, v string) *db {
	next := &db{values: make(map[string]string, len(d.values)+1), hash: d.hash}
	for key, value := range d.values {
		next.values[key] = value
	}
	if old, ok := d.values[k]; ok {
		next.hash -= cellHash(k, old)
	}
	next.values[k] = v
	next.hash += cellHash(k, v)
	return next
}

func listText(elements []string) string {
	s := ""
	for _, e := range elements {
		s += e + "\x1f"
	}
	return s
}

func database(appendMode bool) porcupine.Model {
	return porcupine.Model{
		Init: func() interface{} { return &db{values: map[string]string{}} },
		Step: func(state, input, _ interface{}) (bool, interface{}) {
			cur, o := state.(*db), input.(*op)
			for _, m := range o.Txn {
				if m.F != "r" {
					v := text(m.Value)
					if appendMode {
						v = cur.values[m.Key] + v + "\x1f"
					}
					cur = cur.with(m.Key, v)
					continue
				}
				if o.Return == nil {
					continue // an unknown outcome observed nothing
				}
				held, ok := cur.values[m.Key]
				if appendMode && held != listText(m.List) {
					return false, state
				}
				if !appendMode && ((m.Value == nil) != !ok || (ok && held != *m.Value)) {
					return false, state
				}
			}
			return true, cur
		},
		Equal: func(a, b interface{}) bool {
			x, y := a.(*db), b.(*db)
			if x.hash != y.hash || len(x.values) != len(y.values) {
				return false
			}
			for k, v := range x.values {
				if w, ok := y.values[k]; !ok || w != v {
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
	flag.Parse()
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
		model = database(h.Model == "list-append")
		ops = pruneUnobserved(ops)
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
