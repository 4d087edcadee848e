package cmd

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/app"
)

func newTokenCmd(g *globals) *cobra.Command {
	var o app.TokenOptions
	c := &cobra.Command{
		Use:   "token --tenant=T --sub=U [--role=service|admin] [--ttl=1h] [--kid=K [--key-file=F]]",
		Short: "Print an API token signed with one of the tenant's configured keys",
		Long: `Print a bearer token for the HTTP API, signed with a key of the tenant: without
--kid its jwt_secret (HS256, no kid header); with --kid the key of tenants[].keys of
that kid, which for an HS256 key is its secret and for an RS256, ES256 or EdDSA key
the private key in --key-file (checked against the configured public key); a kid not
configured is taken as one of the tenant's JWKS, signed with --key-file. Claims: tid,
sub, iat, exp (now + ttl), role when given (service manages groups and members and
may send for a member; admin reads any topic and the admin routes; none is a plain
user), and iss and aud when the tenant requires them.`,
		Example: `  TOKEN=$(imshard token --tenant=demo --sub=1 --role=service)
  TOKEN=$(imshard token --tenant=acme --sub=1 --kid=2026-12)
  TOKEN=$(imshard token --tenant=acme --sub=1 --kid=idp-1 --key-file=idp-1.pem)
  curl -H "Authorization: Bearer $TOKEN" localhost:8080/v1/topics/room/messages`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := g.load(nil)
			if err != nil {
				return err
			}
			tok, err := app.Token(cfg, o)
			if err != nil {
				return &UsageError{Err: err}
			}
			_, err = fmt.Fprintln(g.stdout, tok)
			return err
		},
	}
	c.Flags().StringVar(&o.Tenant, "tenant", "", "tenant id (one of the configured tenants)")
	c.Flags().Int64Var(&o.Sub, "sub", 0, "user id (a positive integer)")
	c.Flags().StringVar(&o.Role, "role", "", "service or admin; empty for a plain user")
	c.Flags().DurationVar(&o.TTL, "ttl", time.Hour, "how long the token is valid (at most auth.max_token_ttl)")
	c.Flags().StringVar(&o.KID, "kid", "", "the tenant's key to sign with; empty for its jwt_secret")
	c.Flags().StringVar(&o.KeyFile, "key-file", "", "PEM private key of --kid when it is an RS256, ES256 or EdDSA key")
	_ = c.MarkFlagRequired("tenant")
	_ = c.MarkFlagRequired("sub")
	return c
}
