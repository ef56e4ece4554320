package controlplane

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/aipfleet/aipfleet/registry"
)

// batcher coalesces concurrent lifecycle commands into ApplyLifecycle calls,
// group-commit style: each of a few workers takes the first queued command,
// adds whatever else is queued at that moment (up to maxBatch), and applies
// them in one call. While a call runs, new commands queue up and form the
// next batch, so batches grow with load and latency stays at one call when
// the service is idle. Commands of one batch are applied in arrival order;
// the registry gives each its own replay and sequence semantics.
type batcher struct {
	store    registry.Lifecycle
	queue    chan *pending
	maxBatch int
	workers  int
	timeout  time.Duration
	m        *metrics
	stopped  chan struct{} // closed once every worker has returned
}

// pending is one command waiting for its batch.
type pending struct {
	ctx  context.Context
	cmd  registry.LifecycleCommand
	res  registry.LifecycleResult
	err  error
	done chan struct{}
}

func newBatcher(store registry.Lifecycle, maxBatch, workers int, timeout time.Duration, m *metrics) *batcher {
	return &batcher{
		store: store, maxBatch: maxBatch, workers: workers, timeout: timeout, m: m,
		queue:   make(chan *pending, max(4*maxBatch*workers, 1024)),
		stopped: make(chan struct{}),
	}
}

// submit queues cmd and waits for its result. The error is the store's (the
// whole batch failed: nothing committed), ErrNotRunning, or ctx's.
func (b *batcher) submit(ctx context.Context, cmd registry.LifecycleCommand) (registry.LifecycleResult, error) {
	p := &pending{ctx: ctx, cmd: cmd, done: make(chan struct{})}
	select {
	case b.queue <- p:
	case <-b.stopped:
		return registry.LifecycleResult{}, ErrNotRunning
	case <-ctx.Done():
		return registry.LifecycleResult{}, ctx.Err()
	}
	select {
	case <-p.done:
		return p.res, p.err
	case <-b.stopped:
		// A batch that took p finished before the workers returned.
		select {
		case <-p.done:
			return p.res, p.err
		default:
			return registry.LifecycleResult{}, ErrNotRunning
		}
	case <-ctx.Done():
		return registry.LifecycleResult{}, ctx.Err()
	}
}

// run runs the workers until ctx is done and they have returned. A batch
// handed to the store when ctx ends still completes.
func (b *batcher) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range b.workers {
		wg.Go(func() { b.work(ctx) })
	}
	wg.Wait()
	close(b.stopped)
}

func (b *batcher) work(ctx context.Context) {
	batch := make([]*pending, 0, b.maxBatch)
	for ctx.Err() == nil {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return
		case p := <-b.queue:
			batch = append(batch, p)
		}
	gather:
		for len(batch) < b.maxBatch {
			select {
			case p := <-b.queue:
				batch = append(batch, p)
			default:
				break gather
			}
		}
		b.apply(ctx, batch)
	}
}

// apply applies one batch and answers its commands. Commands whose caller
// gave up while queued are dropped unapplied.
func (b *batcher) apply(ctx context.Context, batch []*pending) {
	live := make([]*pending, 0, len(batch))
	for _, p := range batch {
		if err := p.ctx.Err(); err != nil {
			p.err = err
			close(p.done)
			continue
		}
		live = append(live, p)
	}
	if len(live) == 0 {
		return
	}
	cmds := make([]registry.LifecycleCommand, len(live))
	for i, p := range live {
		cmds[i] = p.cmd
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.timeout)
	start := time.Now()
	res, err := b.store.ApplyLifecycle(actx, cmds)
	cancel()
	b.m.observeBatch(len(cmds), time.Since(start), err)
	if err == nil && len(res) != len(cmds) {
		err = fmt.Errorf("%w: the store answered %d results for %d lifecycle commands", registry.ErrStorage, len(res), len(cmds))
	}
	for i, p := range live {
		if err != nil {
			p.err = err
		} else {
			p.res = res[i]
		}
		close(p.done)
	}
}
