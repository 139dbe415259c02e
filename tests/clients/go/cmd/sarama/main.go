// sarama: IBM/sarama against a broker, at its default Config.Version or the one Spec.Version names (an old one,
// 0.10.2.0 or 0.8.2.0, makes it speak the old protocol versions: Produce v2 or v0 with message format v1 or v0).
//
// The ClusterAdmin creates the topic (from 0.10.1.0 on; CreateTopics is newer than 0.8.2), the client's metadata
// lists it, a SyncProducer produces the records. With Spec.Members > 0 (a ConsumerGroup needs 0.10.2.0 or later)
// that many ConsumerGroup members join, wait until the group settled, consume everything and commit; with 0, a
// Consumer reads every partition and an OffsetManager commits for the group without joining it (what 0.8.2
// clients did). The ClusterAdmin reads the committed offsets back and describes the group.
package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"kafscale.local/tests/clients/go/internal/harness"
)

func main() {
	spec := harness.Read()
	started := time.Now()
	res := harness.New("sarama", harness.ModuleVersion("github.com/IBM/sarama"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(spec.TimeoutS)*time.Second)
	defer cancel()
	res.Finish(started, run(ctx, spec, res))
}

func config(spec harness.Spec) (*sarama.Config, error) {
	cfg := sarama.NewConfig()
	cfg.ClientID = "kafscale-sarama"
	if spec.Version != "" {
		v, err := sarama.ParseKafkaVersion(spec.Version)
		if err != nil {
			return nil, err
		}
		cfg.Version = v
	}
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewHashPartitioner
	switch spec.Compressed {
	case "gzip":
		cfg.Producer.Compression = sarama.CompressionGZIP
	case "snappy":
		cfg.Producer.Compression = sarama.CompressionSnappy
	case "lz4":
		cfg.Producer.Compression = sarama.CompressionLZ4
	case "zstd":
		cfg.Producer.Compression = sarama.CompressionZSTD
	}
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Enable = false
	cfg.Consumer.Return.Errors = true
	cfg.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
	cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRange()}
	cfg.Metadata.Retry.Backoff = 100 * time.Millisecond
	return cfg, cfg.Validate()
}

func run(ctx context.Context, spec harness.Spec, res *harness.Result) error {
	cfg, err := config(spec)
	if err != nil {
		return err
	}
	res.Version = cfg.Version.String()
	addrs := []string{spec.Bootstrap}
	client, err := sarama.NewClient(addrs, cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	defer client.Close()
	// The ClusterAdmin needs the controller, which Metadata names from v1 (0.10.0) on.
	var admin sarama.ClusterAdmin
	if cfg.Version.IsAtLeast(sarama.V0_10_0_0) {
		if admin, err = sarama.NewClusterAdminFromClient(client); err != nil {
			return fmt.Errorf("admin: %w", err)
		}
	}

	if spec.Create && admin == nil {
		return fmt.Errorf("sarama %s has no CreateTopics (0.10.1 added it): create the topic first", cfg.Version)
	}
	if spec.Create {
		detail := &sarama.TopicDetail{NumPartitions: int32(spec.Partitions), ReplicationFactor: 1}
		if err := admin.CreateTopic(spec.Topic, detail, false); err != nil {
			return fmt.Errorf("create topic: %w", err)
		}
		res.Created = true
		res.Step("created %s with %d partitions", spec.Topic, spec.Partitions)
	}
	if err := harness.WaitFor(ctx, "the topic in the metadata", func() bool {
		if err := client.RefreshMetadata(spec.Topic); err != nil {
			return false
		}
		parts, err := client.Partitions(spec.Topic)
		res.Topics[spec.Topic] = len(parts)
		return err == nil && len(parts) == spec.Partitions
	}); err != nil {
		return err
	}
	if cfg.Version.IsAtLeast(sarama.V0_11_0_0) { // ListTopics also asks DescribeConfigs (0.11)
		topics, err := admin.ListTopics()
		if err != nil {
			return fmt.Errorf("list topics: %w", err)
		}
		for name, detail := range topics {
			res.Topics[name] = int(detail.NumPartitions)
		}
	}
	if admin != nil {
		described, err := admin.DescribeTopics([]string{spec.Topic})
		if err != nil || len(described) != 1 || described[0].Err != sarama.ErrNoError {
			return fmt.Errorf("describe topics: %v %v", err, described)
		}
	}
	res.Step("listed")

	var group *groupRun
	if spec.Members > 0 {
		group, err = joinGroup(ctx, spec, cfg, res)
		if err != nil {
			return err
		}
		defer group.close()
		res.Step("group settled")
	}

	producer, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	defer producer.Close()
	msgs := make([]*sarama.ProducerMessage, spec.Records)
	for i := range msgs {
		m := &sarama.ProducerMessage{Topic: spec.Topic, Key: sarama.StringEncoder(harness.Key(i)),
			Timestamp: time.UnixMilli(spec.BaseMs + int64(i))}
		if cfg.Version.IsAtLeast(sarama.V0_11_0_0) { // record batches (message format v2) carry headers
			m.Headers = []sarama.RecordHeader{{Key: []byte("h"), Value: []byte(harness.Header(i))}}
		}
		if v := harness.Value(i); v != nil {
			m.Value = sarama.StringEncoder(*v)
		}
		msgs[i] = m
	}
	for _, m := range msgs { // one at a time: the order of offsets within a partition is the order of i
		if _, _, err := producer.SendMessage(m); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
	}
	for i, m := range msgs {
		res.Produced = append(res.Produced, harness.Rec{Partition: m.Partition, Offset: m.Offset,
			Key: harness.Key(i), Value: harness.Value(i), Timestamp: spec.BaseMs + int64(i), Member: -1})
	}
	res.Step("produced %d", len(msgs))

	if group != nil {
		if err := group.consumeAndCommit(ctx, spec, res); err != nil {
			return err
		}
	} else if err := consumeAlone(ctx, spec, client, res); err != nil {
		return err
	}

	for p := int32(0); p < int32(spec.Partitions); p++ {
		end, err := client.GetOffset(spec.Topic, p, sarama.OffsetNewest)
		if err != nil {
			return fmt.Errorf("end offset of %d: %w", p, err)
		}
		res.EndOffsets[harness.P(p)] = end
	}
	parts := make([]int32, spec.Partitions)
	for p := range parts {
		parts[p] = int32(p)
	}
	offsets, err := fetchOffsets(client, admin, cfg, spec.Group, map[string][]int32{spec.Topic: parts})
	if err != nil {
		return fmt.Errorf("fetch offsets: %w", err)
	}
	for _, p := range parts {
		block := offsets.GetBlock(spec.Topic, p)
		if block == nil {
			return fmt.Errorf("fetch offsets: no answer for partition %d", p)
		}
		if !errors.Is(block.Err, sarama.ErrNoError) {
			return fmt.Errorf("fetch offsets of %d: %w", p, block.Err)
		}
		if block.Offset >= 0 {
			res.Committed[harness.P(p)] = block.Offset
		}
	}
	res.Step("fetched offsets")

	if group != nil {
		groups, err := admin.DescribeConsumerGroups([]string{spec.Group})
		if err != nil || len(groups) != 1 {
			return fmt.Errorf("describe group: %v", err)
		}
		g := groups[0]
		desc := &harness.GroupDescription{State: g.State, ProtocolType: g.ProtocolType, Protocol: g.Protocol}
		for id, m := range g.Members {
			member := harness.Member{Index: -1, MemberID: id, Assigned: []int32{}}
			assignment, err := m.GetMemberAssignment()
			if err != nil {
				return fmt.Errorf("member assignment: %w", err)
			}
			if assignment != nil {
				member.Assigned = append(member.Assigned, assignment.Topics[spec.Topic]...)
			}
			sort.Slice(member.Assigned, func(a, b int) bool { return member.Assigned[a] < member.Assigned[b] })
			desc.Members = append(desc.Members, member)
		}
		sort.Slice(desc.Members, func(a, b int) bool { return desc.Members[a].MemberID < desc.Members[b].MemberID })
		res.Group = desc
		res.Step("described")
	}
	return nil
}

// fetchOffsets reads the group's committed offsets: through the ClusterAdmin, or without one (before 0.10) by an
// OffsetFetch v1 to the group's coordinator, as the OffsetManager itself does.
func fetchOffsets(client sarama.Client, admin sarama.ClusterAdmin, cfg *sarama.Config, group string,
	partitions map[string][]int32) (*sarama.OffsetFetchResponse, error) {
	if admin != nil {
		return admin.ListConsumerGroupOffsets(group, partitions)
	}
	coordinator, err := client.Coordinator(group)
	if err != nil {
		return nil, err
	}
	return coordinator.FetchOffset(sarama.NewOffsetFetchRequest(cfg.Version, group, partitions))
}

// ------------------------------------------------------------------------------------------ a consumer group

type groupRun struct {
	tracker  *harness.Tracker
	groups   []sarama.ConsumerGroup
	sessions []sarama.ConsumerGroupSession
	mu       sync.Mutex
	errs     []error
	cancel   context.CancelFunc
	done     sync.WaitGroup
	res      *harness.Result
	topic    string
}

type handler struct {
	run *groupRun
	i   int
}

func (h handler) Setup(s sarama.ConsumerGroupSession) error {
	h.run.mu.Lock()
	h.run.sessions[h.i] = s
	h.run.mu.Unlock()
	h.run.tracker.Set(h.i, s.MemberID(), s.GenerationID(), s.Claims()[h.run.topic])
	return nil
}

func (h handler) Cleanup(s sarama.ConsumerGroupSession) error {
	h.run.tracker.Set(h.i, s.MemberID(), s.GenerationID(), nil)
	return nil
}

func (h handler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		h.run.res.AddConsumed(record(msg, h.i))
		s.MarkMessage(msg, "")
	}
	return nil
}

func record(msg *sarama.ConsumerMessage, member int) harness.Rec {
	rec := harness.Rec{Partition: msg.Partition, Offset: msg.Offset, Key: string(msg.Key), Member: member,
		Headers: map[string]string{}}
	if !msg.Timestamp.IsZero() {
		rec.Timestamp = msg.Timestamp.UnixMilli()
	}
	if msg.Value != nil {
		v := string(msg.Value)
		rec.Value = &v
	}
	for _, h := range msg.Headers {
		rec.Headers[string(h.Key)] = string(h.Value)
	}
	return rec
}

func joinGroup(ctx context.Context, spec harness.Spec, cfg *sarama.Config, res *harness.Result) (*groupRun, error) {
	g := &groupRun{tracker: harness.NewTracker(spec.Members), groups: make([]sarama.ConsumerGroup, spec.Members),
		sessions: make([]sarama.ConsumerGroupSession, spec.Members), res: res, topic: spec.Topic}
	consumeCtx, cancel := context.WithCancel(ctx)
	g.cancel = cancel
	for i := range g.groups {
		cg, err := sarama.NewConsumerGroup([]string{spec.Bootstrap}, spec.Group, cfg)
		if err != nil {
			g.close()
			return nil, fmt.Errorf("consumer group: %w", err)
		}
		g.groups[i] = cg
		g.done.Add(2)
		go func(i int) {
			defer g.done.Done()
			for consumeCtx.Err() == nil {
				if err := cg.Consume(consumeCtx, []string{spec.Topic}, handler{g, i}); err != nil &&
					consumeCtx.Err() == nil {
					g.fail(fmt.Errorf("member %d: %w", i, err))
					time.Sleep(100 * time.Millisecond)
				}
			}
		}(i)
		go func(i int) {
			defer g.done.Done()
			for err := range cg.Errors() {
				g.fail(fmt.Errorf("member %d: %w", i, err))
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
	sessions := append([]sarama.ConsumerGroupSession{}, g.sessions...)
	g.mu.Unlock()
	for _, s := range sessions {
		s.Commit()
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

// ------------------------------------------------------------------------------ no group: Consumer + OffsetManager

func consumeAlone(ctx context.Context, spec harness.Spec, client sarama.Client, res *harness.Result) error {
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	defer consumer.Close()
	om, err := sarama.NewOffsetManagerFromClient(spec.Group, client)
	if err != nil {
		return fmt.Errorf("offset manager: %w", err)
	}
	defer om.Close()
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	stop := make(chan struct{})
	defer func() { close(stop); wg.Wait() }()
	poms := make([]sarama.PartitionOffsetManager, spec.Partitions)
	for p := int32(0); p < int32(spec.Partitions); p++ {
		pom, err := om.ManagePartition(spec.Topic, p)
		if err != nil {
			return fmt.Errorf("manage partition %d: %w", p, err)
		}
		poms[p] = pom
		next, _ := pom.NextOffset()
		pc, err := consumer.ConsumePartition(spec.Topic, p, next)
		if err != nil {
			return fmt.Errorf("consume partition %d from %d: %w", p, next, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pc.Close()
			for {
				select {
				case <-stop:
					return
				case msg := <-pc.Messages():
					res.AddConsumed(record(msg, 0))
					pom.MarkOffset(msg.Offset+1, "")
				case err := <-pc.Errors():
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				case err := <-pom.Errors():
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	if err := harness.WaitFor(ctx, "every record consumed", func() bool {
		return res.ConsumedCount() >= spec.Records
	}); err != nil {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Errorf("%w (consumed %d of %d; errors: %v)", err, res.ConsumedCount(), spec.Records, errs)
	}
	res.Step("consumed %d", res.ConsumedCount())
	om.Commit()
	time.Sleep(100 * time.Millisecond) // an error of the commit arrives on pom.Errors()
	mu.Lock()
	defer mu.Unlock()
	if len(errs) > 0 {
		return fmt.Errorf("consume or commit: %v", errs)
	}
	res.Step("committed")
	return nil
}
