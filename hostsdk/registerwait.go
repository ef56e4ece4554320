package hostsdk

import (
	"context"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// The backoff of step 8's wait for the control plane (registerWait): from
// registerRetryFirst, doubling up to registerRetryMax, each delay drawn
// within ±50% so that the replicas that started during the same outage do
// not all register in the same instant once it is back. The wait logs a
// retry at most every registerWaitLogEvery.
const (
	registerRetryFirst   = time.Second
	registerRetryMax     = 10 * time.Second
	registerWaitLogEvery = 5 * time.Second
)

// registerWait is bootstrap step 8's wait for a control plane that does
// not answer the registration, bounded by Config.RegisterWait from the
// first failed attempt. It uses the time package's clock (timers, not
// signing windows: Config.Now is not involved). A wait that ends in an
// answer sets MetricRegisterWait to its length if it is the longest yet.
type registerWait struct {
	h       *Host
	bound   time.Duration // NoRegisterWait: fail at once
	bo      *backoff.ExponentialBackOff
	started time.Time // the first failed attempt of this wait; zero: not waiting
	logged  time.Time // when a retry was last logged
	retries int
	longest time.Duration // the longest wait that ended in an answer
}

func (h *Host) newRegisterWait() *registerWait {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = registerRetryFirst
	bo.MaxInterval = registerRetryMax
	bo.MaxElapsedTime = 0 // the wait bounds itself, by Config.RegisterWait
	bo.RandomizationFactor = 0.5
	bo.Multiplier = 2
	bo.Reset()
	return &registerWait{h: h, bound: h.cfg.RegisterWait, bo: bo}
}

// sleep waits before the next attempt after err, an ErrControlUnavailable
// failure: the backoff's delay, cut to what is left of the bound (so the
// last attempt is made when the bound runs out). It returns the error that
// fails the start when the bound has run out, or when ctx ended meanwhile
// (a shutdown requested while starting ends the wait at once).
func (w *registerWait) sleep(ctx context.Context, err error) error {
	h := w.h
	endpoint := h.cfg.ControlPlaneEndpoint
	if w.bound == NoRegisterWait {
		return err
	}
	now := time.Now()
	if w.started.IsZero() {
		w.started, w.logged = now, now
		h.log.Warn("the control plane is unavailable; waiting for it to answer the registration, registering again with backoff",
			"control_plane", endpoint, "wait", w.bound.String(), "setting", settingName("RegisterWait"), "error", err)
	}
	waited := now.Sub(w.started)
	left := w.bound - waited
	if left <= 0 {
		return fmt.Errorf("the control plane at %s did not answer the registration: gave up after waiting %s and %d attempts (%s allows %s): %w",
			endpoint, waited.Round(time.Millisecond), w.retries+1, settingName("RegisterWait"), w.bound, err)
	}
	delay := min(w.bo.NextBackOff(), left)
	if w.retries > 0 && now.Sub(w.logged) >= registerWaitLogEvery {
		w.logged = now
		h.log.Info("the control plane is still unavailable; registering again",
			"control_plane", endpoint, "waited", waited.Round(time.Second).String(), "attempts", w.retries+1,
			"retry_in", delay.Round(time.Millisecond).String(), "wait", w.bound.String(), "error", err)
	}
	w.retries++
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("waiting for the control plane at %s to answer the registration: %w (%w)", endpoint, err, context.Cause(ctx))
	case <-t.C:
		return nil
	}
}

// answered notes a signed answer (lease_live): the control plane is back,
// and a later outage gets a wait of its own.
func (w *registerWait) answered() {
	if !w.started.IsZero() {
		w.h.log.Info("the control plane answers again", "control_plane", w.h.cfg.ControlPlaneEndpoint,
			"waited", w.ended().Round(time.Millisecond).String())
	}
	w.started, w.retries = time.Time{}, 0
	w.bo.Reset()
}

// registered logs how long the registration waited for the control plane,
// if it did.
func (w *registerWait) registered() {
	if w.started.IsZero() {
		return
	}
	w.h.log.Info("registered after waiting for the control plane", "control_plane", w.h.cfg.ControlPlaneEndpoint,
		"waited", w.ended().Round(time.Millisecond).String(), "attempts", w.retries+1)
}

// ended returns how long the wait that an answer ends has lasted, and
// records it in MetricRegisterWait if it is the longest of this start.
func (w *registerWait) ended() time.Duration {
	waited := time.Since(w.started)
	if waited > w.longest {
		w.longest = waited
		w.h.m.registerWait.Set(waited.Seconds())
	}
	return waited
}
