package testenv

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Kafka starts an in-process kfake cluster (one broker, auto topic creation,
// 4 partitions per new topic, on 127.0.0.1 ephemeral ports), closed on
// cleanup, and returns its broker addresses. opts are appended to the
// defaults (e.g. kfake.SeedTopics, kfake.DataDir).
func Kafka(t testing.TB, opts ...kfake.Opt) []string {
	t.Helper()
	return KafkaCluster(t, opts...).ListenAddrs()
}

// KafkaCluster is Kafka returning the cluster itself (for Control hooks).
func KafkaCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	all := append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(4),
	}, opts...)
	c, err := kfake.NewCluster(all...)
	if err != nil {
		t.Fatalf("testenv: start kfake cluster: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}
