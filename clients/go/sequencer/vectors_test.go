// Runs every case of the shared sequencer vectors (spec/sequencer/v1 and v2 at the repository's
// root); v2's valid cases also read back the access and the fence binding.
package sequencer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

const vectorsRoot = "../../../spec/sequencer"

type vectorCase struct {
	Description string `json:"description"`
	Keys        string `json:"keys"`
	Sequencer   string `json:"sequencer"`
	Expect      struct {
		Result  string  `json:"result"`
		Lock    string  `json:"lock"`
		Token   uint64  `json:"token"`
		Session uint64  `json:"session"`
		KeyID   string  `json:"key_id"`
		Access  string  `json:"access"`  // v2
		Slot    *uint32 `json:"slot"`    // v2
		Binding string  `json:"binding"` // v2
	} `json:"expect"`
}

func TestEverySequencerVector(t *testing.T) {
	for _, version := range []struct {
		dir      string
		casesMin int
	}{{"v1", 20}, {"v2", 40}} {
		t.Run(version.dir, func(t *testing.T) {
			dir := filepath.Join(vectorsRoot, version.dir)
			if total := runVectors(t, dir, version.dir == "v2"); total < version.casesMin {
				t.Fatalf("only %d cases in %s", total, dir)
			}
		})
	}
}

func runVectors(t *testing.T, dir string, v2 bool) int {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no vectors in %s: %v", dir, err)
	}
	total := 0
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var file struct {
			Cases []vectorCase `json:"cases"`
		}
		if err := json.Unmarshal(data, &file); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for i, c := range file.Cases {
			total++
			t.Run(filepath.Base(path)+"/"+c.Description, func(t *testing.T) {
				keys, err := ParseKeySet(c.Keys)
				var v Verified
				if err == nil {
					v, err = Verify(c.Sequencer, keys)
				}
				switch c.Expect.Result {
				case "valid":
					if err != nil {
						t.Fatalf("case %d refused: %v", i, err)
					}
					if v.Lock() != c.Expect.Lock || v.Token() != c.Expect.Token || v.Session() != c.Expect.Session || v.KeyID() != c.Expect.KeyID {
						t.Fatalf("case %d read %q %d %d %s", i, v.Lock(), v.Token(), v.Session(), v.KeyID())
					}
					if v2 {
						access := v.Access()
						var slot *uint32
						if access.Kind == Slot {
							slot = &access.Slot
						}
						if access.Kind.String() != c.Expect.Access || (slot == nil) != (c.Expect.Slot == nil) ||
							(slot != nil && *slot != *c.Expect.Slot) || v.Binding() != c.Expect.Binding {
							t.Fatalf("case %d read access %v, binding %q; want %s %v %q", i, access, v.Binding(), c.Expect.Access, c.Expect.Slot, c.Expect.Binding)
						}
					} else if v.Access() != (Access{}) {
						t.Fatalf("case %d: a v1 sequencer read as %v", i, v.Access())
					}
				case "forged":
					if !errors.Is(err, ErrForged) {
						t.Fatalf("case %d: %v, want forged", i, err)
					}
				case "malformed":
					if !errors.Is(err, ErrMalformed) {
						t.Fatalf("case %d: %v, want malformed", i, err)
					}
				default:
					t.Fatalf("case %d: unknown result %q", i, c.Expect.Result)
				}
			})
		}
	}
	return total
}
