package send

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
)

// MsgTypes is the msg_type whitelist (docs/api.md). `system` is reserved to
// the service and admin roles: a plain user must not forge system notices.
var MsgTypes = []string{"text", "image", "file", "audio", "video", "location", "card", "system", "custom"}

// Request is the body of POST /v1/topics/{topic}/messages.
type Request struct {
	ClientMsgID      string          `json:"client_msg_id"`
	MsgType          string          `json:"msg_type"`
	Content          json.RawMessage `json:"content"`
	Head             json.RawMessage `json:"head"`
	MentionedUserIDs message.IDs     `json:"mentioned_user_ids"`
	MentionAll       bool            `json:"mention_all"`
	ReplySeqID       *int64          `json:"reply_seqid"`
	RootSeqID        *int64          `json:"root_seqid"`
	FromUser         *message.ID     `json:"from_user"`
}

func invalid(format string, args ...any) error {
	return httpapi.Errorf(httpapi.CodeInvalidArgument, fmt.Sprintf(format, args...))
}

// DecodeSend reads and validates a send request. maxMentions bounds
// mentioned_user_ids. Nothing about the caller is checked here (see
// Service.authorize); only the shape of the request.
func DecodeSend(r io.Reader, maxMentions int) (Request, error) {
	var req Request
	if err := httpapi.DecodeStrict(r, &req); err != nil {
		return Request{}, err
	}
	if err := req.validate(maxMentions); err != nil {
		return Request{}, err
	}
	return req, nil
}

func (req *Request) validate(maxMentions int) error {
	if err := message.CheckClientMsgID(req.ClientMsgID); err != nil {
		return invalid("%s", err.Error())
	}
	if !slices.Contains(MsgTypes, req.MsgType) {
		return invalid("msg_type must be one of %v", MsgTypes)
	}
	if err := message.CheckStored(req.Content, req.Head); err != nil {
		return invalid("%s", err.Error())
	}
	if message.IsNull(req.Head) {
		req.Head = nil
	}
	if len(req.MentionedUserIDs) > maxMentions {
		return invalid("mentioned_user_ids holds more than %d ids", maxMentions)
	}
	for _, id := range req.MentionedUserIDs {
		if id <= 0 {
			return invalid("mentioned_user_ids must be positive user ids")
		}
	}
	if req.ReplySeqID != nil && *req.ReplySeqID <= 0 {
		return invalid("reply_seqid must be > 0")
	}
	if req.RootSeqID != nil && *req.RootSeqID <= 0 {
		return invalid("root_seqid must be > 0")
	}
	if req.FromUser != nil && *req.FromUser <= 0 {
		return invalid("from_user must be a positive user id")
	}
	return nil
}

// ParseUserID parses a user id path segment: a positive decimal int64.
func ParseUserID(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || strconv.FormatInt(n, 10) != s {
		return 0, invalid("user id must be a positive decimal integer")
	}
	return n, nil
}

// GroupRequest is the body of PUT /v1/topics/{topic}.
type GroupRequest struct {
	GroupID *message.ID `json:"group_id"`
	Name    string      `json:"name"`
	Status  string      `json:"status"`
	// RetentionMonths, when given, replaces the group's retention (0: keep
	// forever); absent keeps what the group has (at first, the tenant's).
	RetentionMonths *int `json:"retention_months"`
}

// MaxGroupName is the longest group name in characters (VARCHAR(255)).
const MaxGroupName = 255

// DecodeGroup reads and validates a group upsert.
func DecodeGroup(r io.Reader) (GroupRequest, error) {
	var req GroupRequest
	if err := httpapi.DecodeStrict(r, &req); err != nil {
		return GroupRequest{}, err
	}
	if req.GroupID == nil || *req.GroupID <= 0 {
		return GroupRequest{}, invalid("group_id is required and must be positive")
	}
	if utf8.RuneCountInString(req.Name) > MaxGroupName {
		return GroupRequest{}, invalid("name must be at most %d characters", MaxGroupName)
	}
	switch req.Status {
	case acl.GroupActive, acl.GroupMuted, acl.GroupDissolved:
	default:
		return GroupRequest{}, invalid("status must be active, muted or dissolved")
	}
	if r := req.RetentionMonths; r != nil && (*r < 0 || *r > config.MaxRetentionMonths) {
		return GroupRequest{}, invalid("retention_months must be between 0 (keep forever) and %d", config.MaxRetentionMonths)
	}
	return req, nil
}

// MemberRequest is the body of PUT /v1/topics/{topic}/members/{uid}.
type MemberRequest struct {
	Role       string        `json:"role"`
	MutedUntil *message.Time `json:"muted_until"`
}

// DecodeMember reads and validates a membership upsert at now.
func DecodeMember(r io.Reader, now time.Time) (MemberRequest, error) {
	var req MemberRequest
	if err := httpapi.DecodeStrict(r, &req); err != nil {
		return MemberRequest{}, err
	}
	switch req.Role {
	case acl.RoleMember, acl.RoleAdmin, acl.RoleOwner:
	default:
		return MemberRequest{}, invalid("role must be member, admin or owner")
	}
	if m := req.MutedUntil; m != nil {
		if err := httpapi.CheckTime("muted_until", m.Time, now); err != nil {
			return MemberRequest{}, err
		}
	}
	return req, nil
}

// mutedUntil converts the optional mute for acl.PutMember.
func (m MemberRequest) mutedUntil() *time.Time {
	if m.MutedUntil == nil {
		return nil
	}
	t := m.MutedUntil.Time
	return &t
}
