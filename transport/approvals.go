package transport

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"

	"github.com/labstack/echo/v4"

	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// approvals is POST .../submissions/:submissionId/approvals: a person's
// decisions on the tool calls a submission waits for. The log checks them
// in one transaction, in the documented order (unknown submission, not
// waiting, unknown approval, decided already, malformed body), so a body
// that is malformed is only reported once the submission and its
// approvals are known to be there.
func (s *Server) approvals(c echo.Context) error {
	if s.stopAd.Load() {
		return apiErr(http.StatusServiceUnavailable, wire.CodeShuttingDown, "the server is shutting down and takes no decisions")
	}
	agent, instance, err := s.instance(c)
	if err != nil {
		return err
	}
	id := pathParam(c, "submissionId")
	if len(id) > record.MaxIDLength {
		return apiErr(http.StatusNotFound, wire.CodeNotFound, "no submission %q for %s/%s", record.Clip(id, 40), agent, instance)
	}
	req := c.Request()
	idemKey, err := idempotencyKey(req.Header)
	if err != nil {
		return err
	}
	if err := checkJSONContentType(req.Header.Get(echo.HeaderContentType)); err != nil {
		return err
	}
	body, release, err := s.readBody(c)
	if err != nil {
		return err
	}
	defer release()
	principal, authed := PrincipalOf(c)
	d := log.Decide{Key: record.Key{Agent: agent, Instance: instance}, SubmissionID: id}
	d.Decisions, d.IDs, d.Malformed = decodeDecisions(body)
	if authed {
		who := &record.Principal{Issuer: principal.Issuer, Subject: principal.Subject}
		for i := range d.Decisions {
			d.Decisions[i].Principal = who
		}
	}
	if idemKey != "" {
		d.IdempotencyKey = idemKey
		d.RequestHash = requestHash(agent, instance, principal.Issuer+"\x00"+principal.Subject, body)
	}
	res, replayed, err := s.opts.Conversations.Decide(req.Context(), d)
	if err != nil {
		var ae *wire.APIError
		if !errors.As(err, &ae) && errors.Is(err, log.ErrInvalidRecord) {
			// The log's own checks of the decisions: a client mistake the
			// decoding above did not catch.
			return badRequest("%s", err.Error())
		}
		return err
	}
	if replayed {
		c.Response().Header().Set("Idempotent-Replayed", "true")
	}
	sub := res.Submission
	if sub.Key.Session == "" {
		// A replay's answer is the stored JSON, which has no key.
		if cur, err := s.db.Submission(req.Context(), sub.ID); err == nil {
			sub.Key = cur.Key
		}
	}
	status := instancePath(agent, instance) + "/submissions/" + url.PathEscape(sub.ID)
	c.Response().Header().Set(echo.HeaderLocation, status)
	pending := sub.Pending
	if pending == nil {
		pending = []record.ApprovalRequest{}
	}
	return writeJSON(c, http.StatusAccepted, wire.Decided{
		SubmissionID: sub.ID,
		Status:       sub.Status,
		Pending:      pending,
		Offset:       res.Offset,
		NextOffset:   res.NextOffset,
		StatusURL:    status,
		UpdatesURL:   instancePath(agent, instance) + "/stream?session=" + url.QueryEscape(sub.Key.Session) + "&offset=" + url.QueryEscape(string(res.Offset)),
	})
}

// decodeDecisions decodes an approvals body strictly. What it cannot
// decode is returned as malformed, together with the approval ids a
// lenient look found, so that the log reports an unknown one first.
func decodeDecisions(body []byte) (decisions []record.ApprovalDecisionPayload, ids []string, malformed error) {
	var lenient struct {
		Decisions []struct {
			ApprovalID json.RawMessage `json:"approvalId"`
		} `json:"decisions"`
	}
	if json.Unmarshal(body, &lenient) == nil {
		for _, d := range lenient.Decisions {
			var id string
			if json.Unmarshal(d.ApprovalID, &id) == nil && id != "" {
				ids = append(ids, id)
			}
		}
	}
	if err := checkStrictJSON(body); err != nil {
		return nil, ids, err
	}
	var strict struct {
		Decisions *[]struct {
			ApprovalID *string          `json:"approvalId"`
			Approved   *bool            `json:"approved"`
			Reason     *string          `json:"reason"`
			Input      *json.RawMessage `json:"input"`
		} `json:"decisions"`
	}
	if err := strictUnmarshal(body, &strict); err != nil {
		return nil, ids, badRequest("%s", describeJSONError(err, ""))
	}
	switch {
	case strict.Decisions == nil:
		return nil, ids, badRequest(`the body needs "decisions": a list of {"approvalId", "approved"}`)
	case len(*strict.Decisions) == 0:
		return nil, ids, badRequest(`"decisions" is empty`)
	case len(*strict.Decisions) > wire.MaxDecisions:
		return nil, ids, badRequest(`"decisions" has %d entries, at most %d`, len(*strict.Decisions), wire.MaxDecisions)
	}
	seen := map[string]bool{}
	for i, x := range *strict.Decisions {
		switch {
		case x.ApprovalID == nil || *x.ApprovalID == "":
			return nil, ids, badRequest(`decisions[%d] needs an "approvalId"`, i)
		case len(*x.ApprovalID) > record.MaxIDLength || !record.Printable(*x.ApprovalID):
			return nil, ids, badRequest(`decisions[%d].approvalId is not an approval id`, i)
		case seen[*x.ApprovalID]:
			return nil, ids, badRequest(`decisions[%d] decides %q a second time`, i, *x.ApprovalID)
		case x.Approved == nil:
			return nil, ids, badRequest(`decisions[%d] needs "approved": true or false`, i)
		case x.Reason != nil && len(*x.Reason) > record.MaxReasonLength:
			return nil, ids, badRequest(`decisions[%d].reason is over %d bytes`, i, record.MaxReasonLength)
		case x.Input != nil && !*x.Approved:
			return nil, ids, badRequest(`decisions[%d] has "input" with a denial: edited arguments go with an approval`, i)
		case x.Input != nil && (len(*x.Input) == 0 || (*x.Input)[0] != '{'):
			return nil, ids, badRequest(`decisions[%d].input must be a JSON object: the tool's arguments`, i)
		}
		seen[*x.ApprovalID] = true
		p := record.ApprovalDecisionPayload{ApprovalID: *x.ApprovalID, Approved: *x.Approved}
		if x.Reason != nil {
			p.Reason = *x.Reason
		}
		if x.Input != nil {
			p.Input = *x.Input
		}
		decisions = append(decisions, p)
	}
	return decisions, ids, nil
}
