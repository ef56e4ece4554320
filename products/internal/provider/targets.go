package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// Log bounds of Targets: a probe runs at every heartbeat, and a warning at
// each would flood the log.
const (
	// TargetLogRepeat is how often a target that keeps failing its check
	// with the same error is logged again.
	TargetLogRepeat = 10 * time.Minute
	// TargetLogMinGap is the least time between two warnings about one
	// target whose error text changes from check to check.
	TargetLogMinGap = time.Minute
)

// Targets is the health of the targets an adapter fronts — its crews or
// endpoints, each with its own URL and credentials — so that one target
// failing its check does not take the whole replica out: the host makes
// a replica whose CheckHealth fails not ready, the control plane takes it
// offline, and every target of every replica with the same configuration
// would be unavailable because of one customer's rotated token.
//
// Check checks every target and fails only when none passed; when some
// passed and others failed it returns hostsdk.Degraded naming the failing
// ones, so the replica stays ready and /ready's connector detail says
// which fail. Refusal is
// the failed result of an action for a target that failed the last check,
// which is not sent to it. Targets logs a target that fails its check
// (again every TargetLogRepeat while it keeps failing) and one that
// passes again. A Targets is safe for concurrent use.
type Targets struct {
	kind   string // "crew", "endpoint": what the messages call a target
	logKey string // the log attribute naming a target: "crew_id", "endpoint"
	logger *slog.Logger
	now    func() time.Time

	mu     sync.Mutex
	failed map[string]*targetFailure
}

// targetFailure is a target that failed its last check.
type targetFailure struct {
	err      error
	logged   string // the error text last logged
	loggedAt time.Time
}

// NewTargets returns the health of targets of a kind ("crew",
// "endpoint"), logged to logger (nil: not logged) with the target's ID
// under logKey ("crew_id", "endpoint"). Every target is healthy until a
// check fails it.
func NewTargets(kind, logKey string, logger *slog.Logger) *Targets {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Targets{kind: kind, logKey: logKey, logger: logger, now: time.Now, failed: map[string]*targetFailure{}}
}

// targetShare is the share of the probe's time a target's check may take:
// a target that does not answer fails its own check before the probe's
// deadline, so the host, which counts a check that outlives the probe
// timeout as not ready, still gets the others' outcome.
const targetShare = 0.75

// Check runs check for every target in ids, at most limit at once (0: all
// at once), and records which failed. When ctx has a deadline, each
// check's context ends three quarters of the way to it; a target whose
// check had not started by then is not judged (it keeps its last
// outcome). Check returns nil when every target passed, a
// hostsdk.DegradedError naming each target that failed (or was not
// checked) when at least one passed, and otherwise an error naming every
// target with its failure. A Check whose
// ctx ended (an abandoned probe) records nothing.
func (t *Targets) Check(ctx context.Context, ids []string, limit int, check func(ctx context.Context, id string) error) error {
	if len(ids) == 0 {
		return nil
	}
	cctx := ctx
	if d, ok := ctx.Deadline(); ok {
		share := time.Duration(float64(time.Until(d)) * targetShare)
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, share)
		defer cancel()
	}
	if limit <= 0 || limit > len(ids) {
		limit = len(ids)
	}
	errs := make([]error, len(ids))
	checked := make([]bool, len(ids))
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for i, id := range ids {
		if cctx.Err() != nil {
			break
		}
		select {
		case sem <- struct{}{}:
		case <-cctx.Done():
		}
		if cctx.Err() != nil {
			break
		}
		checked[i] = true
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = check(cctx, id)
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s health check abandoned: %w", t.kind, err)
	}
	var failed []error
	passed := false
	for i, id := range ids {
		switch {
		case !checked[i]:
			failed = append(failed, fmt.Errorf("%s %s: not checked before the health probe's deadline", t.kind, id))
		case errs[i] != nil:
			t.record(id, errs[i])
			failed = append(failed, fmt.Errorf("%s %s: %w", t.kind, id, errs[i]))
		default:
			t.record(id, nil)
			passed = true
		}
	}
	switch {
	case passed && len(failed) == 0:
		return nil
	case passed:
		return hostsdk.Degraded(fmt.Errorf("%s health check failed for %d of %d: %w", t.kind, len(failed), len(ids), errors.Join(failed...)))
	}
	return fmt.Errorf("every %s failed its health check: %w", t.kind, errors.Join(failed...))
}

// AnyReady combines the Check outcomes of several kinds of targets (a
// Dify connector's apps and knowledge bases), each kind with at least one
// target: nil when every check passed, an error joining them all when
// none passed (not even partly), and otherwise hostsdk.Degraded naming
// every failure, so the replica stays ready while any kind serves and
// /ready says which targets fail.
func AnyReady(errs ...error) error {
	var details []error
	ready := false
	for _, err := range errs {
		var d *hostsdk.DegradedError
		switch {
		case err == nil:
			ready = true
		case errors.As(err, &d):
			ready = true
			details = append(details, d.Err)
		default:
			details = append(details, err)
		}
	}
	switch {
	case len(details) == 0:
		return nil
	case ready:
		return hostsdk.Degraded(errors.Join(details...))
	}
	return errors.Join(errs...)
}

// record records the outcome of id's check, and logs it when it changed
// (at most every TargetLogMinGap) or every TargetLogRepeat while the
// target keeps failing.
func (t *Targets) record(id string, err error) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.failed[id]
	if err == nil {
		if f != nil {
			delete(t.failed, id)
			t.logger.Info(t.kind+" passed its health check again; its actions are sent to it", t.logKey, id)
		}
		return
	}
	if f == nil {
		f = &targetFailure{}
		t.failed[id] = f
	}
	f.err = err
	text := err.Error()
	since := now.Sub(f.loggedAt)
	if f.logged == "" || (text != f.logged && since >= TargetLogMinGap) || since >= TargetLogRepeat {
		f.logged, f.loggedAt = text, now
		t.logger.Warn(t.kind+" failed its health check; its actions fail without being sent to it until a check passes, the others are served",
			t.logKey, id, "error", err)
	}
}

// Failed returns the failure of target id's last check; nil when it
// passed or was not checked yet.
func (t *Targets) Failed(id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f := t.failed[id]; f != nil {
		return f.err
	}
	return nil
}

// Refusal returns the failed result of action actionID for target id when
// id failed its last check, and false when it did not. Nothing is sent:
// the error names the target and its check's failure, and is classified
// as that failure would be (a rotated credential provider.unauthorized,
// not retryable; no answer or a 5xx provider.unavailable, retryable).
func (t *Targets) Refusal(actionID, id string) (*aip.ActionResult, bool) {
	err := t.Failed(id)
	if err == nil {
		return nil, false
	}
	msg := fmt.Sprintf("%s %s failed its last health check, so this action was not sent to it and nothing ran; the host checks it again at every heartbeat: %v",
		t.kind, id, err)
	msg = aip.TruncateUTF8(msg, aip.MaxErrorMessageBytes)
	var pe *Error
	var perr *aip.ProtocolError
	if errors.As(err, &pe) {
		perr = ProtocolError(pe)
		perr.Message = msg
	} else {
		perr = aip.NewProtocolError(CodeUnavailable, aip.CategoryTransport, true, 0, msg)
	}
	return &aip.ActionResult{ActionID: actionID, Status: aip.ResultFailed, Error: perr}, true
}
