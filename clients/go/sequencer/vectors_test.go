// Runs every case of the shared sequencer vectors (spec/sequencer/v1 at the repository's root).
package sequencer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

const vectorsDir = "../../../spec/sequencer/v1"

type vectorCase struct {
	Description string `json:"description"`
	Keys        string `json:"keys"`
	Sequencer   string `json:"sequencer"`
	Expect      struct {
		Result  string `json:"result"`
		Lock    string `json:"lock"`
		Token   uint64 `json:"token"`
		Session uint64 `json:"session"`
		KeyID   string `json:"key_id"`
	} `json:"expect"`
}

func TestEverySequencerVector(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(vectorsDir, "*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no vectors in %s: %v", vectorsDir, err)
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
	if total < 20 {
		t.Fatalf("only %d cases", total)
	}
}
