package stream

import (
	"fmt"
	"testing"

	"github.com/imshard/imshard/modules/tenantdb"
)

// TestRemovedTenantCountsAsDenied: a membership check that fails because
// the socket's tenant is no longer configured is a refusal, not an outage
// to retry: the socket stops following the topic instead of keeping it
// through ever longer pauses.
func TestRemovedTenantCountsAsDenied(t *testing.T) {
	err := fmt.Errorf("acl: group: %w", fmt.Errorf("%w: %q", tenantdb.ErrUnknownTenant, "gone"))
	if !denied(err) {
		t.Fatalf("denied(%v) = false: the check would be retried forever", err)
	}
}
