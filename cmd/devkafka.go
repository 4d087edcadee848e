package cmd

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
)

type devKafkaOptions struct {
	addr    string
	dataDir string
}

func newDevKafkaCmd(g *globals) *cobra.Command {
	o := &devKafkaOptions{}
	c := &cobra.Command{
		Use:     "devkafka --addr=127.0.0.1:19092 --data-dir=DIR",
		Short:   "Run the in-process Kafka stand-in as its own process (development and tests; never production)",
		Example: "  imshard devkafka --addr=127.0.0.1:19092 --data-dir=/tmp/imshard-kafka",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := g.load(g.serverFlags(nil))
			if err != nil {
				return err
			}
			k := cfg.Kafka
			if o.dataDir != "" {
				k.DataDir = o.dataDir
			}
			log := g.serverLogger(cfg)
			cluster, err := app.StartDevKafka(k, o.addr, log)
			if err != nil {
				return err
			}
			defer cluster.Close()
			if k.SASL.Mechanism == "" {
				log.Warn().Msg("devkafka accepts any local client: set kafka.sasl (SCRAM) in its configuration and the clients' to require that user")
			}
			log.Info().Strs("brokers", cluster.ListenAddrs()).Str("data_dir", k.DataDir).Str("sasl_mechanism", k.SASL.Mechanism).Msg("devkafka listening")
			fmt.Fprintln(g.stdout, cluster.ListenAddrs()[0])
			ctx, stop := signalContext()
			defer stop()
			<-ctx.Done()
			log.Info().Msg("devkafka stopping")
			return nil
		},
	}
	c.Flags().StringVar(&o.addr, "addr", "127.0.0.1:19092", "listen address")
	c.Flags().StringVar(&o.dataDir, "data-dir", "", "log directory (default kafka.data_dir)")
	return c
}
