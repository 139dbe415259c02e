// kafkago: segmentio/kafka-go against a broker. kafka.Client creates the topic and reads its metadata; a Writer
// (hash balancer, acks=all) produces the records; Spec.Members kafka.ConsumerGroup members join, wait until the
// group settled, read their partitions with one Reader each from the generation's offsets and commit through
// the generation; kafka.Client fetches the committed offsets, lists the end offsets and describes the group.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/compress"

	"kafscale.local/tests/clients/go/internal/harness"
)

func main() {
	spec := harness.Read()
	started := time.Now()
	res := harness.New("kafka-go", harness.ModuleVersion("github.com/segmentio/kafka-go"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(spec.TimeoutS)*time.Second)
	defer cancel()
	res.Finish(started, run(ctx, spec, res))
}

func codec(name string) compress.Compression {
	switch name {
	case "gzip":
		return compress.Gzip
	case "snappy":
		return compress.Snappy
	case "lz4":
		return compress.Lz4
	case "zstd":
		return compress.Zstd
	}
	return compress.None
}

func run(ctx context.Context, spec harness.Spec, res *harness.Result) error {
	addr, err := net.ResolveTCPAddr("tcp", spec.Bootstrap)
	if err != nil {
		return err
	}
	client := &kafka.Client{Addr: addr, Timeout: 10 * time.Second}

	if spec.Create {
		created, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{
			{Topic: spec.Topic, NumPartitions: spec.Partitions, ReplicationFactor: 1}}})
		if err == nil {
			err = created.Errors[spec.Topic]
		}
		if err != nil {
			return fmt.Errorf("create topic: %w", err)
		}
		res.Created = true
		res.Step("created %s with %d partitions", spec.Topic, spec.Partitions)
	}
	if err := harness.WaitFor(ctx, "the topic in the metadata", func() bool {
		meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{spec.Topic}})
		if err != nil {
			return false
		}
		for _, t := range meta.Topics {
			if t.Error == nil {
				res.Topics[t.Name] = len(t.Partitions)
			}
		}
		return res.Topics[spec.Topic] == spec.Partitions
	}); err != nil {
		return err
	}
	res.Step("listed")

	g, err := joinGroup(ctx, spec, res)
	if err != nil {
		return err
	}
	defer g.close()
	res.Step("group settled")

	var produceMu sync.Mutex
	writer := &kafka.Writer{Addr: addr, Topic: spec.Topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: 10 * time.Millisecond, Compression: codec(spec.Compressed),
		Completion: func(msgs []kafka.Message, err error) {
			if err != nil {
				return
			}
			produceMu.Lock()
			defer produceMu.Unlock()
			for _, m := range msgs {
				res.Produced = append(res.Produced, harness.Rec{Partition: int32(m.Partition), Offset: m.Offset,
					Key: string(m.Key), Value: value(m.Value), Timestamp: m.Time.UnixMilli(), Member: -1})
			}
		}}
	msgs := make([]kafka.Message, spec.Records)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: []byte(harness.Key(i)), Time: time.UnixMilli(spec.BaseMs + int64(i)),
			Headers: []kafka.Header{{Key: "h", Value: []byte(harness.Header(i))}}}
		if v := harness.Value(i); v != nil {
			msgs[i].Value = []byte(*v)
		}
	}
	err = writer.WriteMessages(ctx, msgs...)
	if cerr := writer.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	res.Step("produced %d", len(res.Produced))

	if err := g.consumeAndCommit(ctx, spec, res); err != nil {
		return err
	}

	parts := make([]int, spec.Partitions)
	last := make([]kafka.OffsetRequest, spec.Partitions)
	for p := range parts {
		parts[p] = p
		last[p] = kafka.LastOffsetOf(p)
	}
	fetched, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: spec.Group,
		Topics: map[string][]int{spec.Topic: parts}})
	if err == nil {
		err = fetched.Error
	}
	if err != nil {
		return fmt.Errorf("fetch offsets: %w", err)
	}
	for _, p := range fetched.Topics[spec.Topic] {
		if p.Error != nil {
			return fmt.Errorf("fetch offsets of %d: %w", p.Partition, p.Error)
		}
		if p.CommittedOffset >= 0 {
			res.Committed[harness.P(int32(p.Partition))] = p.CommittedOffset
		}
	}
	ends, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{
		spec.Topic: last}})
	if err != nil {
		return fmt.Errorf("end offsets: %w", err)
	}
	for _, p := range ends.Topics[spec.Topic] {
		if p.Error != nil {
			return fmt.Errorf("end offset of %d: %w", p.Partition, p.Error)
		}
		res.EndOffsets[harness.P(int32(p.Partition))] = p.LastOffset
	}
	res.Step("fetched offsets")

	described, err := client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{spec.Group}})
	if err != nil || len(described.Groups) != 1 || described.Groups[0].Error != nil {
		return fmt.Errorf("describe group: %v %+v", err, described)
	}
	d := described.Groups[0]
	desc := &harness.GroupDescription{State: d.GroupState}
	for _, m := range d.Members {
		member := harness.Member{Index: -1, MemberID: m.MemberID, Assigned: []int32{}}
		for _, t := range m.MemberAssignments.Topics {
			if t.Topic == spec.Topic {
				for _, p := range t.Partitions {
					member.Assigned = append(member.Assigned, int32(p))
				}
			}
		}
		sort.Slice(member.Assigned, func(a, b int) bool { return member.Assigned[a] < member.Assigned[b] })
		desc.Members = append(desc.Members, member)
	}
	sort.Slice(desc.Members, func(a, b int) bool { return desc.Members[a].MemberID < desc.Members[b].MemberID })
	res.Group = desc
	res.Step("described")
	return nil
}

func value(b []byte) *string {
	if b == nil {
		return nil
	}
	v := string(b)
	return &v
}

type groupRun struct {
	tracker *harness.Tracker
	groups  []*kafka.ConsumerGroup
	mu      sync.Mutex
	gens    []*kafka.Generation
	next    []map[int]int64 // per member: partition -> the offset after the last record read
	errs    []error
	cancel  context.CancelFunc
	done    sync.WaitGroup
}

func joinGroup(ctx context.Context, spec harness.Spec, res *harness.Result) (*groupRun, error) {
	g := &groupRun{tracker: harness.NewTracker(spec.Members), groups: make([]*kafka.ConsumerGroup, spec.Members),
		gens: make([]*kafka.Generation, spec.Members), next: make([]map[int]int64, spec.Members)}
	runCtx, cancel := context.WithCancel(ctx)
	g.cancel = cancel
	for i := range g.groups {
		cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{ID: spec.Group, Brokers: []string{spec.Bootstrap},
			Topics: []string{spec.Topic}, GroupBalancers: []kafka.GroupBalancer{kafka.RangeGroupBalancer{}},
			HeartbeatInterval: 500 * time.Millisecond, StartOffset: kafka.FirstOffset})
		if err != nil {
			g.close()
			return nil, fmt.Errorf("consumer group: %w", err)
		}
		g.groups[i] = cg
		g.done.Add(1)
		go func(i int) {
			defer g.done.Done()
			for runCtx.Err() == nil {
				gen, err := cg.Next(runCtx)
				if err != nil {
					if runCtx.Err() == nil && !errors.Is(err, kafka.ErrGroupClosed) {
						g.fail(fmt.Errorf("member %d: %w", i, err))
						time.Sleep(100 * time.Millisecond)
					}
					continue
				}
				var held []int32
				for _, a := range gen.Assignments[spec.Topic] {
					held = append(held, int32(a.ID))
				}
				g.mu.Lock()
				g.gens[i], g.next[i] = gen, map[int]int64{}
				g.mu.Unlock()
				g.tracker.Set(i, gen.MemberID, gen.ID, held)
				for _, a := range gen.Assignments[spec.Topic] {
					a := a
					gen.Start(func(genCtx context.Context) { g.read(genCtx, spec, i, a, res) })
				}
			}
		}(i)
	}
	if err := g.tracker.WaitStable(ctx, spec.Partitions, time.Second); err != nil {
		g.close()
		return nil, fmt.Errorf("%w (errors: %v)", err, g.errors())
	}
	// What went wrong while the members joined (a rebalance under way when the second one came) is noted; from
	// here on, any error fails the run.
	g.mu.Lock()
	for _, err := range g.errs {
		res.Step("while joining: %v", err)
	}
	g.errs = nil
	g.mu.Unlock()
	return g, nil
}

// read reads one assigned partition from the generation's offset until the generation ends.
func (g *groupRun) read(ctx context.Context, spec harness.Spec, member int, a kafka.PartitionAssignment,
	res *harness.Result) {
	reader := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{spec.Bootstrap}, Topic: spec.Topic,
		Partition: a.ID, MaxWait: 200 * time.Millisecond})
	defer reader.Close()
	if err := reader.SetOffset(a.Offset); err != nil {
		g.fail(fmt.Errorf("member %d, partition %d: %w", member, a.ID, err))
		return
	}
	for {
		m, err := reader.ReadMessage(ctx)
		if err != nil {
			if ctx.Err() == nil {
				g.fail(fmt.Errorf("member %d, partition %d: %w", member, a.ID, err))
			}
			return
		}
		rec := harness.Rec{Partition: int32(m.Partition), Offset: m.Offset, Key: string(m.Key), Value: value(m.Value),
			Timestamp: m.Time.UnixMilli(), Member: member, Headers: map[string]string{}}
		for _, h := range m.Headers {
			rec.Headers[h.Key] = string(h.Value)
		}
		res.AddConsumed(rec)
		g.mu.Lock()
		g.next[member][m.Partition] = m.Offset + 1
		g.mu.Unlock()
	}
}

func (g *groupRun) fail(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.errs = append(g.errs, err)
}

func (g *groupRun) errors() []error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]error{}, g.errs...)
}

func (g *groupRun) consumeAndCommit(ctx context.Context, spec harness.Spec, res *harness.Result) error {
	if err := harness.WaitFor(ctx, "every record consumed", func() bool {
		return res.ConsumedCount() >= spec.Records
	}); err != nil {
		return fmt.Errorf("%w (consumed %d of %d; errors: %v)", err, res.ConsumedCount(), spec.Records, g.errors())
	}
	res.Step("consumed %d", res.ConsumedCount())
	g.mu.Lock()
	gens := append([]*kafka.Generation{}, g.gens...)
	next := append([]map[int]int64{}, g.next...)
	g.mu.Unlock()
	for i, gen := range gens {
		if err := gen.CommitOffsets(map[string]map[int]int64{spec.Topic: next[i]}); err != nil {
			return fmt.Errorf("member %d commit: %w", i, err)
		}
	}
	if errs := g.errors(); len(errs) > 0 {
		return fmt.Errorf("group: %v", errs)
	}
	res.Members = g.tracker.Members()
	res.Step("committed")
	return nil
}

func (g *groupRun) close() {
	g.cancel()
	for _, cg := range g.groups {
		if cg != nil {
			cg.Close()
		}
	}
	g.done.Wait()
}
