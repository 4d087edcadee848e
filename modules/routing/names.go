package routing

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	imsql "github.com/imshard/imshard/sql"
)

// Identifiers and request values imshard accepts (invariant 5, docs/invariants.md).
// Tenants (^[a-z0-9_]{1,32}$) and topics (^[A-Za-z0-9_-]{1,64}$) are
// checked by nameOf: every request checks both, and a regexp was a few
// percent of a hot-cache page's CPU.
var tablePattern = regexp.MustCompile(`^im_group_messages_[0-9]{6}$`)

// Errors for rejected identifiers; callers map them to invalid_argument.
var (
	ErrInvalidTenant = errors.New("invalid tenant id")
	ErrInvalidTopic  = errors.New("invalid topic")
	ErrInvalidTable  = errors.New("invalid table name")
)

// ValidTenant checks a tenant id against ^[a-z0-9_]{1,32}$.
func ValidTenant(id string) error {
	if !nameOf(id, 32, false) {
		return fmt.Errorf("%w: %q", ErrInvalidTenant, id)
	}
	return nil
}

// ValidTopic checks a topic against ^[A-Za-z0-9_-]{1,64}$.
func ValidTopic(topic string) error {
	if !nameOf(topic, 64, true) {
		return fmt.Errorf("%w: %q", ErrInvalidTopic, truncate(topic, 80))
	}
	return nil
}

// nameOf reports whether s is 1 to most bytes of lower-case letters,
// digits and '_', and with topic also upper-case letters and '-'.
func nameOf(s string, most int, topic bool) bool {
	if s == "" || len(s) > most {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_':
		case topic && (c >= 'A' && c <= 'Z' || c == '-'):
		default:
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Table is a month-table name that passed the whitelist. Only this package
// makes one, from a Month; SQL gets it through Quoted.
type Table struct {
	month Month
}

// The legacy single table and its read-only rename: fixed
// constants, never built from input.
const (
	LegacyTable        = "im_group_messages"
	LegacyRenamedTable = "im_group_messages_legacy"
)

const tablePrefix = "im_group_messages_"

// TableFor returns the month table of m. It fails for a month outside the
// sane range; registration in the catalog is checked by Catalog.Table.
func TableFor(m Month) (Table, error) {
	if !m.Valid() {
		return Table{}, fmt.Errorf("%w: month %q out of range", ErrInvalidTable, m.String())
	}
	t := Table{month: m}
	if !tablePattern.MatchString(t.Name()) {
		return Table{}, fmt.Errorf("%w: %q", ErrInvalidTable, t.Name())
	}
	return t, nil
}

// ParseTable accepts only names matching ^im_group_messages_[0-9]{6}$ whose
// digits are a valid month.
func ParseTable(name string) (Table, error) {
	if !tablePattern.MatchString(name) {
		return Table{}, fmt.Errorf("%w: %q", ErrInvalidTable, truncate(name, 80))
	}
	m, err := ParseMonth(strings.TrimPrefix(name, tablePrefix))
	if err != nil {
		return Table{}, fmt.Errorf("%w: %q: %v", ErrInvalidTable, name, err)
	}
	return Table{month: m}, nil
}

// Month is the table's month.
func (t Table) Month() Month { return t.month }

// Name is the bare table name.
func (t Table) Name() string { return tablePrefix + t.month.String() }

// Quoted is the name as a backquoted identifier, the only form spliced into SQL.
func (t Table) Quoted() string { return "`" + t.Name() + "`" }

// CreateDDL renders the month-table template for t.
func (t Table) CreateDDL() string {
	return strings.Replace(imsql.MonthTable(), imsql.TablePlaceholder, t.Quoted(), 1)
}

// SenderIndexDDL adds t's (from_user, topic, seqid) index when missing
// (a table made before the template had it).
func (t Table) SenderIndexDDL() string {
	return strings.Replace(imsql.SenderIndex(), imsql.TablePlaceholder, t.Quoted(), 1)
}

// DropDDL drops t (an aborted migration plan's empty month tables).
func (t Table) DropDDL() string {
	return strings.Replace(imsql.DropTable(), imsql.TablePlaceholder, t.Quoted(), 1)
}
