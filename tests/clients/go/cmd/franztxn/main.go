// franztxn: franz-go's GroupTransactSession, the consume-transform-produce loop of exactly-once Go pipelines.
//
// The input topic (Spec.Topic, filled by the test with the harness's records) is read in group Spec.Group,
// read_committed; each record goes to the output topic (Spec.Topic + "-out") with the same key and the value
// "t-" + its value, and the consumed offsets commit in the same transaction. Every third transaction of a member
// ends with an abort instead: its output must never be seen read_committed, and the session rewinds to the
// committed offsets so that its input is transformed again. A second member joins once the first has committed a
// few transactions, so a rebalance happens while transactions run. The members stop once their committed
// transactions hold every input record; the result says how many transactions committed and aborted.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"kafscale.local/tests/clients/go/internal/harness"
)

type result struct {
	Client    string   `json:"client"`
	Module    string   `json:"module"`
	Committed int64    `json:"committed_txns"`
	Aborted   int64    `json:"aborted_txns"`
	Records   int64    `json:"records_committed"` // input records whose transformation committed
	Members   int      `json:"members"`
	Steps     []string `json:"steps"`
	Error     string   `json:"error,omitempty"`
	Seconds   float64  `json:"seconds"`
	mu        sync.Mutex
}

func (r *result) step(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Steps = append(r.Steps, fmt.Sprintf(format, args...))
}

func main() {
	spec := harness.Read()
	started := time.Now()
	res := &result{Client: "franz-go GroupTransactSession", Module: harness.ModuleVersion("github.com/twmb/franz-go"),
		Steps: []string{}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(spec.TimeoutS)*time.Second)
	defer cancel()
	err := run(ctx, spec, res)
	res.Seconds = time.Since(started).Seconds()
	if err != nil {
		res.Error = err.Error()
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	if err != nil {
		os.Exit(1)
	}
}

func run(ctx context.Context, spec harness.Spec, res *result) error {
	members := max(spec.Members, 1)
	res.Members = members
	var records atomic.Int64 // input records transformed in committed transactions, over all members
	done := make(chan struct{})
	var once sync.Once
	errs := make(chan error, members)
	var wg sync.WaitGroup
	firstCommits := make(chan struct{})
	var firstOnce sync.Once
	for m := 0; m < members; m++ {
		if m > 0 { // the others join once the first has committed: a rebalance while transactions run
			select {
			case <-firstCommits:
			case <-done:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		wg.Add(1)
		go func(m int) {
			defer wg.Done()
			err := member(ctx, spec, res, m, &records, done, func(committed int64) {
				if committed >= 3 {
					firstOnce.Do(func() { close(firstCommits) })
				}
				if records.Load() >= int64(spec.Records) {
					once.Do(func() { close(done) })
				}
			})
			if err != nil {
				errs <- fmt.Errorf("member %d: %w", m, err)
				once.Do(func() { close(done) })
			}
		}(m)
	}
	wg.Wait()
	close(errs)
	res.Records = records.Load()
	for err := range errs {
		return err
	}
	if res.Records != int64(spec.Records) {
		return fmt.Errorf("%d input records committed, %d expected", res.Records, spec.Records)
	}
	return nil
}

func member(ctx context.Context, spec harness.Spec, res *result, m int, records *atomic.Int64, done <-chan struct{},
	after func(committed int64)) error {
	sess, err := kgo.NewGroupTransactSession(
		kgo.SeedBrokers(spec.Bootstrap),
		kgo.TransactionalID(fmt.Sprintf("%s-txn-%d", spec.Group, m)),
		kgo.TransactionTimeout(20*time.Second),
		kgo.ConsumerGroup(spec.Group),
		kgo.ConsumeTopics(spec.Topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(10*time.Second),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DefaultProduceTopic(spec.Topic+"-out"),
	)
	if err != nil {
		return err
	}
	defer sess.Close()
	res.step("member %d: session started", m)
	var mine int64 // this member's transactions, committed or aborted
	var committed int64
	for {
		select {
		case <-done:
			res.step("member %d: stopped after %d transactions", m, mine)
			return nil
		default:
		}
		poll, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fetches := sess.PollRecords(poll, 20) // small transactions: many of them, and a rebalance among them
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var fetchErr error
		fetches.EachError(func(t string, p int32, err error) {
			if err != context.DeadlineExceeded && fetchErr == nil {
				fetchErr = fmt.Errorf("fetch %s/%d: %w", t, p, err)
			}
		})
		if fetchErr != nil {
			return fetchErr
		}
		var batch []*kgo.Record
		fetches.EachRecord(func(r *kgo.Record) { batch = append(batch, r) })
		if len(batch) == 0 {
			continue
		}
		if err := sess.Begin(); err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		var produceErr atomic.Value
		var produced sync.WaitGroup
		for _, in := range batch {
			value := append([]byte("t-"), in.Value...)
			if in.Value == nil {
				value = []byte("t-null")
			}
			produced.Add(1)
			sess.Produce(ctx, &kgo.Record{Key: in.Key, Value: value}, func(_ *kgo.Record, err error) {
				defer produced.Done()
				if err != nil {
					produceErr.Store(err)
				}
			})
		}
		produced.Wait()
		mine++
		want := kgo.TryCommit
		if mine%3 == 0 || produceErr.Load() != nil {
			want = kgo.TryAbort
		}
		ok, err := sess.End(ctx, want)
		if err != nil {
			return fmt.Errorf("end transaction %d: %w", mine, err)
		}
		if ok {
			committed++
			atomic.AddInt64(&res.Committed, 1)
			records.Add(int64(len(batch)))
		} else {
			atomic.AddInt64(&res.Aborted, 1)
		}
		after(committed)
	}
}
