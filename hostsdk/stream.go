package hostsdk

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/aipfleet/aipfleet/aip"
)

// ErrStreamClosed is returned by ChunkWriter.Send after the action returned
// or the receiver went away. A streaming action whose Handle returns an
// error matching it (other than a *aip.ProtocolError) is journaled
// outcome_unknown: the host cannot tell whether its effect happened (a
// read-only capability's is failed connector_host.interrupted: Interrupted).
var ErrStreamClosed = errors.New("hostsdk: stream closed")

// ChunkWriter sends a streaming action's chunks to the dispatcher, in
// order: each Send writes one signed stream_chunk envelope (sequence 0, 1,
// 2, ...) as an NDJSON line and flushes it. Send blocks while the receiver is
// slow (TCP back-pressure), for at most Config.HandleGrace (at least 10 s) plus the line's
// size at 256 KiB/s: a receiver slower than that has stopped reading, and
// Send fails with ErrStreamClosed (as it does once the receiver went
// away). It is safe for concurrent use; chunks are numbered in the order
// Send is called.
type ChunkWriter struct {
	// mu is a lock held by a Send while it writes (a channel of one
	// token, not a sync.Mutex: abandon may wait for it as long as a
	// write deadline, and a goroutine waiting on a channel is durably
	// blocked for testing/synctest, so a bubble's clock can reach that
	// deadline).
	mu       chan struct{}
	x        *exchange
	actionID string
	seq      uint64
	closed   bool
	err      error
	// abandoned is set, without the lock, when the host abandons the
	// call: Sends waiting for the lock then fail instead of writing.
	abandoned atomic.Bool
}

// Send writes a chunk of the given kind with data marshalled to JSON (nil
// for no data).
func (c *ChunkWriter) Send(kind aip.ChunkKind, data any) error {
	var raw json.RawMessage
	if data != nil {
		var err error
		if raw, err = json.Marshal(data); err != nil {
			return fmt.Errorf("hostsdk: chunk data: %w", err)
		}
	}
	return c.send(&aip.StreamChunk{Kind: kind, Data: raw})
}

// SendPart writes a chunk carrying a message part.
func (c *ChunkWriter) SendPart(kind aip.ChunkKind, part aip.MessagePart) error {
	return c.send(&aip.StreamChunk{Kind: kind, Part: &part})
}

// Sent returns how many chunks were written.
func (c *ChunkWriter) Sent() uint64 {
	c.lock()
	defer c.unlock()
	return c.seq
}

func (c *ChunkWriter) send(chunk *aip.StreamChunk) error {
	if !chunk.Kind.Valid() {
		return fmt.Errorf("hostsdk: unknown chunk kind %q", chunk.Kind)
	}
	c.lock()
	defer c.unlock()
	if c.closed || c.abandoned.Load() {
		return ErrStreamClosed
	}
	if c.err != nil {
		return c.err
	}
	chunk.ActionID, chunk.Sequence = c.actionID, c.seq
	raw, err := c.x.envelope(aip.Body{StreamChunk: chunk})
	if err != nil {
		return fmt.Errorf("hostsdk: sign chunk: %w", err)
	}
	c.x.startStream()
	if err := c.x.write(append(raw, '\n')); err != nil {
		c.err = fmt.Errorf("%w: %v", ErrStreamClosed, err)
		return c.err
	}
	c.seq++
	return nil
}

// abandon closes the writer of a call the host stopped waiting for: a
// Send from now on fails with ErrStreamClosed, and abandon returns once no
// Send writes to the response (the host's final line follows it). A Send
// already writing is let finish: one blocked on a receiver that stopped
// reading fails at its own write deadline (answerWriteTimeout), and one
// to a receiver that reads, or only paused, completes and leaves the
// stream whole for the final line. Cutting it short (a write deadline of
// now) broke the connection under a receiver that still reads, and the
// dispatcher got no answer.
func (c *ChunkWriter) abandon() {
	c.abandoned.Store(true)
	c.close()
}

func (c *ChunkWriter) close() {
	c.lock()
	defer c.unlock()
	c.closed = true
}

func newChunkWriter(x *exchange, actionID string) *ChunkWriter {
	return &ChunkWriter{mu: make(chan struct{}, 1), x: x, actionID: actionID}
}

func (c *ChunkWriter) lock()   { c.mu <- struct{}{} }
func (c *ChunkWriter) unlock() { <-c.mu }
