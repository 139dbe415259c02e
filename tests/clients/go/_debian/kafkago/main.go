// kafkago-debian: Debian's kafka-go (golang-github-segmentio-kafka-go-dev, 0.2.1), which speaks fixed old versions:
// CreateTopics v0, Metadata v1, Produce v2 (message format v1: timestamps, no headers), Fetch v2, ListOffsets v1,
// FindCoordinator v0, JoinGroup v1, SyncGroup v0, Heartbeat v0, OffsetCommit v2, OffsetFetch v1, LeaveGroup v0.
//
// Built in GOPATH mode (GO111MODULE=off, GOPATH=...:/usr/share/gocode; the Makefile's go-clients target). A Conn
// creates the topic and reads its partitions; a Writer (round robin; 0.2.1 reports no offsets) produces; Spec.Members
// Readers of one group read everything and commit what they read synchronously; a Conn per partition leader
// lists the end offsets. The committed offsets are read back by the test (0.2.1 has no exported OffsetFetch).
package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"../../internal/harness"
)

func main() {
	spec := harness.Read()
	started := time.Now()
	res := harness.New("kafka-go-debian", "0.2.1 (golang-github-segmentio-kafka-go-dev)")
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(spec.TimeoutS)*time.Second)
	defer cancel()
	res.Finish(started, run(ctx, spec, res))
}

func run(ctx context.Context, spec harness.Spec, res *harness.Result) error {
	conn, err := kafka.DialContext(ctx, "tcp", spec.Bootstrap)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	if spec.Create {
		if err := conn.CreateTopics(kafka.TopicConfig{Topic: spec.Topic, NumPartitions: spec.Partitions,
			ReplicationFactor: 1}); err != nil {
			return fmt.Errorf("create topic: %w", err)
		}
		res.Created = true
		res.Step("created %s with %d partitions", spec.Topic, spec.Partitions)
	}
	if err := harness.WaitFor(ctx, "the topic in the metadata", func() bool {
		parts, err := conn.ReadPartitions(spec.Topic)
		if err != nil {
			return false
		}
		res.Topics[spec.Topic] = len(parts)
		return len(parts) == spec.Partitions
	}); err != nil {
		return err
	}
	res.Step("listed")

	writer := kafka.NewWriter(kafka.WriterConfig{Brokers: []string{spec.Bootstrap}, Topic: spec.Topic,
		RequiredAcks: -1, BatchTimeout: 10 * time.Millisecond})
	msgs := make([]kafka.Message, spec.Records)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: []byte(harness.Key(i)), Time: time.Unix(0, (spec.BaseMs+int64(i))*1e6)}
		if v := harness.Value(i); v != nil {
			msgs[i].Value = []byte(*v)
		}
		res.Produced = append(res.Produced, harness.Rec{Partition: -1, Offset: -1, Key: harness.Key(i),
			Value: harness.Value(i), Timestamp: spec.BaseMs + int64(i), Member: -1})
	}
	err = writer.WriteMessages(ctx, msgs...)
	if cerr := writer.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	res.Step("produced %d", spec.Records)

	readers := make([]*kafka.Reader, spec.Members)
	for i := range readers {
		readers[i] = kafka.NewReader(kafka.ReaderConfig{Brokers: []string{spec.Bootstrap}, GroupID: spec.Group,
			Topic: spec.Topic, MaxWait: 200 * time.Millisecond, HeartbeatInterval: 500 * time.Millisecond})
	}
	readCtx, stopReading := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for i, r := range readers {
		wg.Add(1)
		go func(i int, r *kafka.Reader) {
			defer wg.Done()
			for {
				m, err := r.FetchMessage(readCtx)
				if err == nil {
					err = r.CommitMessages(readCtx, m)
				}
				if err != nil {
					if readCtx.Err() == nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("member %d: %w", i, err))
						mu.Unlock()
					}
					return
				}
				rec := harness.Rec{Partition: int32(m.Partition), Offset: m.Offset, Key: string(m.Key),
					Timestamp: m.Time.UnixNano() / 1e6, Member: i}
				if m.Value != nil {
					v := string(m.Value)
					rec.Value = &v
				}
				res.AddConsumed(rec)
			}
		}(i, r)
	}
	waitErr := harness.WaitFor(ctx, "every record consumed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(errs) > 0 || res.ConsumedCount() >= spec.Records
	})
	stopReading()
	wg.Wait()
	for _, r := range readers {
		r.Close() // leaves the group
	}
	if waitErr != nil || len(errs) > 0 {
		return fmt.Errorf("consume: %v (consumed %d of %d; errors: %v)", waitErr, res.ConsumedCount(), spec.Records,
			errs)
	}
	res.Step("consumed and committed %d", res.ConsumedCount())

	for p := 0; p < spec.Partitions; p++ {
		leader, err := kafka.DialLeader(ctx, "tcp", spec.Bootstrap, spec.Topic, p)
		if err != nil {
			return fmt.Errorf("leader of %d: %w", p, err)
		}
		end, err := leader.ReadLastOffset()
		leader.Close()
		if err != nil {
			return fmt.Errorf("end offset of %d: %w", p, err)
		}
		res.EndOffsets[harness.P(int32(p))] = end
	}
	res.Step("listed end offsets")
	return nil
}
