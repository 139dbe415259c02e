// sarama-debian: Debian's sarama (golang-github-shopify-sarama-dev, 1.22.1, github.com/Shopify/sarama) at its
// default configuration: Config.Version 0.8.2.0, so Metadata v0, Produce v0 (message format v0: no timestamps,
// no headers), Fetch v0, ListOffsets v0, FindCoordinator v0, OffsetCommit v1 and OffsetFetch v1.
//
// Built in GOPATH mode (GO111MODULE=off, GOPATH=...:/usr/share/gocode; the Makefile's go-clients target): the
// folder's leading underscore keeps it out of the module in tests/clients/go. The topic exists already
// (CreateTopics is newer than 0.8.2); a SyncProducer produces, a Consumer reads every partition, an OffsetManager
// commits for the group without joining it and an OffsetFetch to the coordinator reads the offsets back.
package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/Shopify/sarama"

	"../../internal/harness"
)

func main() {
	spec := harness.Read()
	started := time.Now()
	res := harness.New("sarama-debian", "1.22.1 (golang-github-shopify-sarama-dev)")
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(spec.TimeoutS)*time.Second)
	defer cancel()
	res.Finish(started, run(ctx, spec, res))
}

func run(ctx context.Context, spec harness.Spec, res *harness.Result) error {
	cfg := sarama.NewConfig() // Version: sarama.MinVersion, 0.8.2.0
	cfg.ClientID = "kafscale-sarama-debian"
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewHashPartitioner
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Return.Errors = true
	cfg.Metadata.Retry.Backoff = 100 * time.Millisecond
	res.Version = cfg.Version.String()
	client, err := sarama.NewClient([]string{spec.Bootstrap}, cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	defer client.Close()
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
	res.Step("listed")

	producer, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	defer producer.Close()
	for i := 0; i < spec.Records; i++ {
		m := &sarama.ProducerMessage{Topic: spec.Topic, Key: sarama.StringEncoder(harness.Key(i))}
		if v := harness.Value(i); v != nil {
			m.Value = sarama.StringEncoder(*v)
		}
		p, off, err := producer.SendMessage(m)
		if err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		res.Produced = append(res.Produced, harness.Rec{Partition: p, Offset: off, Key: harness.Key(i),
			Value: harness.Value(i), Member: -1})
	}
	res.Step("produced %d", spec.Records)

	if err := consume(ctx, spec, client, res); err != nil {
		return err
	}

	for p := int32(0); p < int32(spec.Partitions); p++ {
		end, err := client.GetOffset(spec.Topic, p, sarama.OffsetNewest)
		if err != nil {
			return fmt.Errorf("end offset of %d: %w", p, err)
		}
		res.EndOffsets[harness.P(p)] = end
	}
	coordinator, err := client.Coordinator(spec.Group)
	if err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	req := &sarama.OffsetFetchRequest{Version: 1, ConsumerGroup: spec.Group}
	for p := int32(0); p < int32(spec.Partitions); p++ {
		req.AddPartition(spec.Topic, p)
	}
	fetched, err := coordinator.FetchOffset(req)
	if err != nil {
		return fmt.Errorf("fetch offsets: %w", err)
	}
	for p := int32(0); p < int32(spec.Partitions); p++ {
		block := fetched.GetBlock(spec.Topic, p)
		if block == nil || block.Err != sarama.ErrNoError {
			return fmt.Errorf("fetch offsets of %d: %+v", p, block)
		}
		if block.Offset >= 0 {
			res.Committed[harness.P(p)] = block.Offset
		}
	}
	res.Step("fetched offsets")
	return nil
}

func consume(ctx context.Context, spec harness.Spec, client sarama.Client, res *harness.Result) error {
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	defer consumer.Close()
	om, err := sarama.NewOffsetManagerFromClient(spec.Group, client)
	if err != nil {
		return fmt.Errorf("offset manager: %w", err)
	}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	stop := make(chan struct{})
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
		go func(pc sarama.PartitionConsumer, pom sarama.PartitionOffsetManager) {
			defer wg.Done()
			defer pc.Close()
			for {
				select {
				case <-stop:
					return
				case msg := <-pc.Messages():
					rec := harness.Rec{Partition: msg.Partition, Offset: msg.Offset, Key: string(msg.Key)}
					if msg.Value != nil {
						v := string(msg.Value)
						rec.Value = &v
					}
					res.AddConsumed(rec)
					pom.MarkOffset(msg.Offset+1, "")
				case err := <-pc.Errors():
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}(pc, pom)
	}
	waitErr := harness.WaitFor(ctx, "every record consumed", func() bool { return res.ConsumedCount() >= spec.Records })
	close(stop)
	wg.Wait()
	if waitErr != nil {
		return fmt.Errorf("%w (consumed %d of %d; errors: %v)", waitErr, res.ConsumedCount(), spec.Records, errs)
	}
	res.Step("consumed %d", res.ConsumedCount())
	// 1.22 has no OffsetManager.Commit: closing the partition managers and the manager flushes the marked offsets.
	for _, pom := range poms {
		if err := pom.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := om.Close(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("consume or commit: %v", errs)
	}
	res.Step("committed")
	return nil
}
