// A controller elected by client-go's leaderelection.RunOrDie on a Palisade lock (package k8s),
// whose leader fences every write with its epoch.
//
// Run two or more of these against one `palisade serve` (PALISADE_ENDPOINT, default
// 127.0.0.1:7457) and one PostgreSQL database (DATABASE_URL). The leader prints its epoch (the
// lock's fencing token) and sequencer, then appends a row to the table leader_demo every
// -every, each in a transaction whose first statement claims the fence scope "leader-demo" with
// its sequencer (clients/go/fence/postgres). Kill the leader with kill -9: another candidate
// leads once the dead leader's session expires (-ttl), with a higher epoch. A write with the dead
// leader's sequencer is then refused by the fence:
//
//	leader-demo -late-write SEQUENCER
//
// makes one such write, prints "refused: ..." and exits with status 3 when the fence refuses it
// (status 0 if it was accepted). Ctrl-C (SIGINT or SIGTERM) releases the lock at once.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"k8s.io/client-go/tools/leaderelection"

	palisade "example.invalid/palisade/clients/go"
	"example.invalid/palisade/clients/go/fence"
	"example.invalid/palisade/clients/go/fence/postgres"
	"example.invalid/palisade/clients/go/k8s"
)

// The fence scope every leader's write claims, and the table it writes.
const (
	scope     = "leader-demo"
	createSQL = `CREATE TABLE IF NOT EXISTS leader_demo (
        n bigint PRIMARY KEY,
        epoch bigint NOT NULL,
        holder text NOT NULL
    )`
)

func main() {
	hostname, _ := os.Hostname()
	identity := flag.String("id", hostname, "this candidate's identity")
	lockName := flag.String("lock", "controllers/leader-demo", "the Palisade lock the candidates campaign for")
	ttl := flag.Duration("ttl", 2*time.Second, "the candidate's session lease: how long a dead leader keeps the lock")
	every := flag.Duration("every", 300*time.Millisecond, "how often the leader writes")
	lateWrite := flag.String("late-write", "", "make one write with this sequencer, as a deposed leader would, and exit")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix(*identity + ": ")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	endpoints := strings.Split(orDefault(os.Getenv("PALISADE_ENDPOINT"), "127.0.0.1:7457"), ",")
	client, err := palisade.New(ctx, palisade.Config{Endpoints: endpoints})
	check(err)
	defer client.Close()
	keys, err := client.PublicKeys(ctx) // what `palisade pubkey` prints, fetched once
	check(err)
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	check(err)
	defer db.Close()
	check(postgres.EnsureSchema(ctx, db))
	_, err = db.ExecContext(ctx, createSQL)
	check(err)
	w := writer{db: db, verifier: fence.NewVerifier(keys), lock: *lockName, holder: *identity}

	if *lateWrite != "" {
		n, err := w.write(ctx, *lateWrite)
		if err != nil {
			fmt.Printf("refused: %v\n", err)
			os.Exit(3)
		}
		fmt.Printf("late write accepted as row %d\n", n)
		return
	}

	lock, err := k8s.NewLock(client, *lockName, *identity, *ttl)
	check(err)
	defer lock.Close(context.Background())
	fmt.Printf("%s: campaigning for %s\n", *identity, *lockName)
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   2 * *ttl,
		RenewDeadline:   *ttl * 3 / 2,
		RetryPeriod:     *ttl / 8,
		ReleaseOnCancel: true,
		Name:            "leader-demo",
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				epoch, sequencer := lock.Epoch(), lock.Sequencer()
				fmt.Printf("%s: leading with epoch %d sequencer %s\n", *identity, epoch, sequencer)
				for {
					n, err := w.write(ctx, sequencer)
					switch {
					case err == nil:
						fmt.Printf("%s: wrote row %d with epoch %d\n", *identity, n, epoch)
					case ctx.Err() != nil:
						return
					case errors.Is(err, fence.ErrStale):
						log.Fatalf("deposed: %v", err) // a newer leader wrote: stop at once
					default:
						log.Printf("write failed (retrying): %v", err)
					}
					select {
					case <-ctx.Done():
						return
					case <-time.After(*every):
					}
				}
			},
			OnStoppedLeading: func() { fmt.Printf("%s: stopped leading\n", *identity) },
		},
	})
}

type writer struct {
	db       *sql.DB
	verifier *fence.Verifier
	lock     string
	holder   string
}

// write appends one row in a transaction that claims the fence scope with sequencer first.
func (w writer) write(ctx context.Context, sequencer string) (int64, error) {
	verified, err := w.verifier.Verify(sequencer)
	if err != nil {
		return 0, err
	}
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	if err := postgres.Claim(ctx, tx, scope, verified, w.lock); err != nil {
		return 0, err
	}
	var n int64
	if err := tx.QueryRowContext(ctx, "INSERT INTO leader_demo (n, epoch, holder) "+
		"SELECT coalesce(max(n), 0) + 1, $1, $2 FROM leader_demo RETURNING n",
		int64(verified.Token()), w.holder).Scan(&n); err != nil {
		return 0, err
	}
	return n, postgres.Commit(tx)
}

func orDefault(value, fallback string) string {
	if value == "" {
		return fallback
	}
	return value
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
