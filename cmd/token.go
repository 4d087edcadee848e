package cmd

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
)

func newTokenCmd(g *globals) *cobra.Command {
	var (
		tenant, role string
		sub          int64
		ttl          time.Duration
	)
	c := &cobra.Command{
		Use:   "token --tenant=T --sub=U [--role=service|admin] [--ttl=1h]",
		Short: "Print an API token signed with the tenant's configured jwt_secret",
		Long: `Print a bearer token for the HTTP API, signed (HS256) with the jwt_secret the
configuration gives the tenant. Claims: tid, sub, iat, exp (now + ttl) and role when
given (service manages groups and members and may send for a member; admin reads
any topic and the admin routes; none is a plain user).`,
		Example: `  TOKEN=$(imshard token --tenant=demo --sub=1 --role=service)
  curl -H "Authorization: Bearer $TOKEN" localhost:8080/v1/topics/room/messages`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := g.load(nil)
			if err != nil {
				return err
			}
			tok, err := app.Token(cfg, tenant, sub, role, ttl)
			if err != nil {
				return &UsageError{Err: err}
			}
			_, err = fmt.Fprintln(g.stdout, tok)
			return err
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "tenant id (one of the configured tenants)")
	c.Flags().Int64Var(&sub, "sub", 0, "user id (a positive integer)")
	c.Flags().StringVar(&role, "role", "", "service or admin; empty for a plain user")
	c.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the token is valid (at most auth.max_token_ttl)")
	_ = c.MarkFlagRequired("tenant")
	_ = c.MarkFlagRequired("sub")
	return c
}
