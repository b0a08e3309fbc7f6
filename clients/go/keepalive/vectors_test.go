// Runs every case of the shared keepalive vectors (spec/keepalive/v2 at the repository's root)
// against the Go engine, step by step: the actions, the wake time and the lease deadline.
package keepalive

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const vectorsDir = "../../../spec/keepalive/v2"

type vectorCase struct {
	Description string `json:"description"`
	Config      struct {
		TTLMs      int64   `json:"ttl_ms"`
		IntervalMs *int64  `json:"interval_ms"`
		OpenedAtMs int64   `json:"opened_at_ms"`
		JitterSeed *uint64 `json:"jitter_seed"`
	} `json:"config"`
	Steps []map[string]json.RawMessage `json:"steps"`
}

// optional is a JSON field that may be absent, null or a number.
type optional struct {
	present bool
	value   *int64
}

func readOptional(step map[string]json.RawMessage, key string) (optional, error) {
	raw, ok := step[key]
	if !ok {
		return optional{}, nil
	}
	var v *int64
	if err := json.Unmarshal(raw, &v); err != nil {
		return optional{}, err
	}
	return optional{true, v}, nil
}

// decodeStrict unmarshals, refusing unknown fields other than comments (keys starting with _).
func decodeStrict(raw json.RawMessage, into any, allowed ...string) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return err
	}
	for key := range fields {
		if !strings.HasPrefix(key, "_") && !contains(allowed, key) {
			return fmt.Errorf("unknown field %q", key)
		}
	}
	return json.Unmarshal(raw, into)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func eventOf(raw json.RawMessage) (Event, error) {
	var e struct {
		Type           string `json:"type"`
		TTLRemainingMs int64  `json:"ttl_remaining_ms"`
		LeaderNamed    bool   `json:"leader_named"`
	}
	if err := decodeStrict(raw, &e, "type", "ttl_remaining_ms", "leader_named"); err != nil {
		return Event{}, err
	}
	return Event{Type: EventType(e.Type), TTLRemainingMs: e.TTLRemainingMs, LeaderNamed: e.LeaderNamed}, nil
}

// actionJSON is an action as the vectors spell it: only the fields its type has.
func actionJSON(a Action) map[string]any {
	out := map[string]any{"type": string(a.Type)}
	switch a.Type {
	case CloseStream, Lost:
		out["reason"] = a.Reason
	case Pause:
		out["until"] = float64(a.Until)
	case Renew:
		if a.HasUntil {
			out["until"] = float64(a.Until)
		} else {
			out["until"] = nil
		}
	}
	return out
}

func TestEveryKeepaliveVector(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(vectorsDir, "*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no vectors in %s: %v", vectorsDir, err)
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var c vectorCase
			dec := json.NewDecoder(bytes.NewReader(data))
			if err := dec.Decode(&c); err != nil {
				t.Fatal(err)
			}
			interval := int64(0)
			if c.Config.IntervalMs != nil {
				interval = *c.Config.IntervalMs
			}
			engine := New(c.Config.TTLMs, interval, c.Config.OpenedAtMs, c.Config.JitterSeed)
			for i, step := range c.Steps {
				var at int64
				if err := json.Unmarshal(step["at"], &at); err != nil {
					t.Fatalf("step %d: at: %v", i, err)
				}
				for key := range step {
					if !strings.HasPrefix(key, "_") && !contains([]string{"at", "event", "actions", "wake", "lease_deadline"}, key) {
						t.Fatalf("step %d: unknown field %q", i, key)
					}
				}
				ev, err := eventOf(step["event"])
				if err != nil {
					t.Fatalf("step %d: event: %v", i, err)
				}
				got := []map[string]any{}
				for _, a := range engine.On(ev, at) {
					got = append(got, actionJSON(a))
				}
				var want []map[string]any
				if err := json.Unmarshal(step["actions"], &want); err != nil {
					t.Fatalf("step %d: actions: %v", i, err)
				}
				if want == nil {
					want = []map[string]any{}
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d (%s at %d): actions %v, want %v\n%s", i, ev.Type, at, got, want, c.Description)
				}
				if wake, err := readOptional(step, "wake"); err != nil {
					t.Fatal(err)
				} else if wake.present {
					w, ok := engine.Wake()
					if ok != (wake.value != nil) || (ok && w != *wake.value) {
						t.Fatalf("step %d (%s at %d): wake %d (%v), want %v\n%s", i, ev.Type, at, w, ok, show(wake.value), c.Description)
					}
				}
				if deadline, err := readOptional(step, "lease_deadline"); err != nil {
					t.Fatal(err)
				} else if deadline.present {
					d, ok := engine.LeaseDeadline()
					if ok != (deadline.value != nil) || (ok && d != *deadline.value) {
						t.Fatalf("step %d (%s at %d): lease deadline %d (%v), want %v\n%s", i, ev.Type, at, d, ok, show(deadline.value), c.Description)
					}
				}
			}
		})
	}
}

func show(v *int64) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprint(*v)
}
