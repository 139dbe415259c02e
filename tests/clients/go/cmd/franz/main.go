// franz: franz-go (kgo and kadm) against a broker. kadm creates the topic and lists it; kgo produces the records
// (synchronously: each record's partition and offset as the broker gave them); Spec.Members consumers join one
// group (the classic protocol, range balancer), wait until the group settled, consume everything and commit;
// kadm reads the committed offsets, the end offsets and the group's description back.
package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"kafscale.local/tests/clients/go/internal/harness"
)

func main() {
	spec := harness.Read()
	started := time.Now()
	res := harness.New("franz-go", harness.ModuleVersion("github.com/twmb/franz-go"))
	res.Version = "kadm " + harness.ModuleVersion("github.com/twmb/franz-go/pkg/kadm")
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(spec.TimeoutS)*time.Second)
	defer cancel()
	res.Finish(started, run(ctx, spec, res))
}

func codec(name string) kgo.CompressionCodec {
	switch name {
	case "gzip":
		return kgo.GzipCompression()
	case "snappy":
		return kgo.SnappyCompression()
	case "lz4":
		return kgo.Lz4Compression()
	case "zstd":
		return kgo.ZstdCompression()
	}
	return kgo.NoCompression()
}

func run(ctx context.Context, spec harness.Spec, res *harness.Result) error {
	seeds := kgo.SeedBrokers(spec.Bootstrap)
	admin, err := kgo.NewClient(seeds)
	if err != nil {
		return err
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)

	if spec.Create {
		created, err := adm.CreateTopic(ctx, int32(spec.Partitions), 1, nil, spec.Topic)
		if err == nil {
			err = created.Err
		}
		if err != nil {
			return fmt.Errorf("create topic: %w", err)
		}
		res.Created = true
		res.Step("created %s with %d partitions", spec.Topic, spec.Partitions)
	}
	if err := harness.WaitFor(ctx, "the topic in ListTopics", func() bool {
		topics, err := adm.ListTopics(ctx)
		if err != nil || topics.Error() != nil {
			return false
		}
		for name, detail := range topics {
			res.Topics[name] = len(detail.Partitions)
		}
		return res.Topics[spec.Topic] == spec.Partitions
	}); err != nil {
		return err
	}
	res.Step("listed")

	// The group first, settled before anything is produced: no record is read before its partition's final owner
	// has it, so each member reads exactly its own partitions.
	tracker := harness.NewTracker(spec.Members)
	members := make([]*kgo.Client, spec.Members)
	for i := range members {
		i := i
		members[i], err = kgo.NewClient(seeds,
			kgo.ConsumerGroup(spec.Group),
			kgo.ConsumeTopics(spec.Topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.DisableAutoCommit(),
			kgo.Balancers(kgo.RangeBalancer()),
			kgo.HeartbeatInterval(500*time.Millisecond),
			kgo.OnPartitionsAssigned(func(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
				member, generation := cl.GroupMetadata()
				tracker.Set(i, member, generation, assigned[spec.Topic])
			}),
			kgo.OnPartitionsRevoked(func(_ context.Context, cl *kgo.Client, _ map[string][]int32) {
				member, generation := cl.GroupMetadata()
				tracker.Set(i, member, generation, nil)
			}),
		)
		if err != nil {
			return err
		}
	}
	defer func() {
		for _, m := range members {
			m.Close() // leaves the group
		}
	}()
	var polling sync.WaitGroup
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer func() { stopPolling(); polling.Wait() }()
	var pollErr error
	var pollMu sync.Mutex
	for i, m := range members {
		polling.Add(1)
		go func(i int, m *kgo.Client) {
			defer polling.Done()
			for pollCtx.Err() == nil {
				fetches := m.PollFetches(pollCtx)
				fetches.EachError(func(topic string, p int32, err error) {
					if pollCtx.Err() == nil {
						pollMu.Lock()
						pollErr = fmt.Errorf("member %d, %s[%d]: %w", i, topic, p, err)
						pollMu.Unlock()
					}
				})
				fetches.EachRecord(func(r *kgo.Record) {
					rec := harness.Rec{Partition: r.Partition, Offset: r.Offset, Key: string(r.Key),
						Timestamp: r.Timestamp.UnixMilli(), Member: i, Headers: map[string]string{}}
					if r.Value != nil {
						v := string(r.Value)
						rec.Value = &v
					}
					for _, h := range r.Headers {
						rec.Headers[h.Key] = string(h.Value)
					}
					res.AddConsumed(rec)
				})
			}
		}(i, m)
	}
	if err := tracker.WaitStable(ctx, spec.Partitions, time.Second); err != nil {
		return err
	}
	res.Step("group settled")

	producer, err := kgo.NewClient(seeds, kgo.DefaultProduceTopic(spec.Topic), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchCompression(codec(spec.Compressed)), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return err
	}
	defer producer.Close()
	records := make([]*kgo.Record, spec.Records)
	for i := range records {
		r := &kgo.Record{Key: []byte(harness.Key(i)), Headers: []kgo.RecordHeader{{Key: "h", Value: []byte(harness.Header(i))}},
			Timestamp: time.UnixMilli(spec.BaseMs + int64(i))}
		if v := harness.Value(i); v != nil {
			r.Value = []byte(*v)
		}
		records[i] = r
	}
	if err := producer.ProduceSync(ctx, records...).FirstErr(); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	for i, r := range records {
		res.Produced = append(res.Produced, harness.Rec{Partition: r.Partition, Offset: r.Offset, Key: string(r.Key),
			Value: harness.Value(i), Timestamp: r.Timestamp.UnixMilli(), Member: -1})
	}
	res.Step("produced %d", len(records))

	if err := harness.WaitFor(ctx, "every record consumed", func() bool {
		pollMu.Lock()
		defer pollMu.Unlock()
		return pollErr != nil || res.ConsumedCount() >= spec.Records
	}); err != nil {
		return fmt.Errorf("%w (consumed %d of %d)", err, res.ConsumedCount(), spec.Records)
	}
	if pollErr != nil {
		return pollErr
	}
	res.Step("consumed %d", res.ConsumedCount())
	for i, m := range members {
		if err := m.CommitUncommittedOffsets(ctx); err != nil {
			return fmt.Errorf("member %d commit: %w", i, err)
		}
	}
	res.Step("committed")
	res.Members = tracker.Members()

	committed, err := adm.FetchOffsets(ctx, spec.Group)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return fmt.Errorf("fetch offsets: %w", err)
	}
	committed.Each(func(o kadm.OffsetResponse) {
		if o.Topic == spec.Topic {
			res.Committed[harness.P(o.Partition)] = o.At
		}
	})
	ends, err := adm.ListEndOffsets(ctx, spec.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("end offsets: %w", err)
	}
	ends.Each(func(o kadm.ListedOffset) { res.EndOffsets[harness.P(o.Partition)] = o.Offset })
	described, err := adm.DescribeGroups(ctx, spec.Group)
	if err == nil {
		err = described.Error()
	}
	if err != nil {
		return fmt.Errorf("describe group: %w", err)
	}
	g := described[spec.Group]
	desc := &harness.GroupDescription{State: g.State, ProtocolType: g.ProtocolType, Protocol: g.Protocol}
	for _, m := range g.Members {
		member := harness.Member{Index: -1, MemberID: m.MemberID, Assigned: []int32{}}
		if assigned, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range assigned.Topics {
				if t.Topic == spec.Topic {
					member.Assigned = append(member.Assigned, t.Partitions...)
				}
			}
		}
		sort.Slice(member.Assigned, func(a, b int) bool { return member.Assigned[a] < member.Assigned[b] })
		desc.Members = append(desc.Members, member)
	}
	res.Group = desc
	res.Step("described")
	return nil
}
