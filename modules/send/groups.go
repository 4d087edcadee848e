package send

import (
	"errors"
	"net/http"
	"time"

	"github.com/imshard/imshard/modules/acl"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// maxManageBody bounds the group and member bodies (a few small fields).
const maxManageBody = 4096

// manager checks the role and the topic of a management request.
func manager(r *http.Request, p httpapi.Principal) (string, error) {
	if p.Role != httpapi.RoleService && p.Role != httpapi.RoleAdmin {
		return "", httpapi.Errorf(httpapi.CodePermissionDenied, "groups and members are managed by the service or admin role")
	}
	topic := r.PathValue("topic")
	return topic, routing.ValidTopic(topic)
}

func aclError(err error) error {
	if errors.Is(err, acl.ErrNoGroup) {
		return httpapi.Errorf(httpapi.CodeNotFound, "topic has no group")
	}
	return unavailable("group store unavailable", err)
}

type groupResponse struct {
	Topic   string     `json:"topic"`
	GroupID message.ID `json:"group_id"`
	Name    string     `json:"name"`
	Status  string     `json:"status"`
	// RetentionMonths is the group's own retention; absent: the tenant's.
	RetentionMonths *int `json:"retention_months,omitempty"`
}

func (s *Service) handlePutGroup(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	topic, err := manager(r, p)
	if err != nil {
		return err
	}
	req, err := DecodeGroup(http.MaxBytesReader(w, r.Body, maxManageBody))
	if err != nil {
		return err
	}
	if err := s.p.ACL.PutGroup(r.Context(), p.Tenant, topic, int64(*req.GroupID), req.Name, req.Status); err != nil {
		return aclError(err)
	}
	retention := req.RetentionMonths
	if retention != nil {
		if err := s.p.ACL.SetRetention(r.Context(), p.Tenant, topic, *retention); err != nil {
			return aclError(err)
		}
	} else if retention, err = s.p.ACL.Retention(r.Context(), p.Tenant, topic); err != nil {
		return aclError(err)
	}
	httpapi.WriteJSON(w, http.StatusOK, groupResponse{Topic: topic, GroupID: *req.GroupID, Name: req.Name, Status: req.Status, RetentionMonths: retention})
	return nil
}

type memberResponse struct {
	Topic      string        `json:"topic"`
	UserID     message.ID    `json:"user_id"`
	Role       string        `json:"role"`
	MutedUntil *message.Time `json:"muted_until"`
}

func (s *Service) handlePutMember(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	topic, err := manager(r, p)
	if err != nil {
		return err
	}
	uid, err := ParseUserID(r.PathValue("uid"))
	if err != nil {
		return err
	}
	req, err := DecodeMember(http.MaxBytesReader(w, r.Body, maxManageBody), time.Now())
	if err != nil {
		return err
	}
	// a member of no group could never post; say so instead of storing it
	if _, err := s.p.ACL.Lookup(r.Context(), p.Tenant, topic, uid); err != nil {
		return aclError(err)
	}
	if err := s.p.ACL.PutMember(r.Context(), p.Tenant, topic, uid, req.Role, req.mutedUntil()); err != nil {
		return aclError(err)
	}
	httpapi.WriteJSON(w, http.StatusOK, memberResponse{Topic: topic, UserID: message.ID(uid), Role: req.Role, MutedUntil: req.MutedUntil})
	return nil
}

func (s *Service) handleDeleteMember(w http.ResponseWriter, r *http.Request, p httpapi.Principal) error {
	topic, err := manager(r, p)
	if err != nil {
		return err
	}
	uid, err := ParseUserID(r.PathValue("uid"))
	if err != nil {
		return err
	}
	if err := s.p.ACL.DeleteMember(r.Context(), p.Tenant, topic, uid); err != nil {
		return aclError(err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
