package hostsdk

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// ErrStreamClosed is returned by ChunkWriter.Send after the action returned
// or the receiver went away. A streaming action whose Handle returns an
// error matching it (other than a *aip.ProtocolError) is journaled
// outcome_unknown: the host cannot tell whether its effect happened.
var ErrStreamClosed = errors.New("hostsdk: stream closed")

// ChunkWriter sends a streaming action's chunks to the dispatcher, in
// order: each Send writes one signed stream_chunk envelope (sequence 0, 1,
// 2, ...) as an NDJSON line and flushes it. Send blocks while the receiver is
// slow (TCP back-pressure), for at most Config.HandleGrace plus the line's
// size at 256 KiB/s: a receiver slower than that has stopped reading, and
// Send fails with ErrStreamClosed (as it does once the receiver went
// away). It is safe for concurrent use; chunks are numbered in the order
// Send is called.
type ChunkWriter struct {
	mu       sync.Mutex
	x        *exchange
	actionID string
	seq      uint64
	closed   bool
	err      error
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
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seq
}

func (c *ChunkWriter) send(chunk *aip.StreamChunk) error {
	if !chunk.Kind.Valid() {
		return fmt.Errorf("hostsdk: unknown chunk kind %q", chunk.Kind)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
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

// abandon closes the writer of a call the host stopped waiting for. A
// Send in progress holds the lock, and may be blocked writing to a
// receiver that stopped reading until its write deadline (Send has no
// context): the response's write deadline is set to now, so that its
// write fails, then cleared once the writer is closed (the host's final
// line sets its own).
func (c *ChunkWriter) abandon() {
	if c.mu.TryLock() {
		c.closed = true
		c.mu.Unlock()
		return
	}
	rc := http.NewResponseController(c.x.w)
	_ = rc.SetWriteDeadline(time.Now())
	c.close()
	_ = rc.SetWriteDeadline(time.Time{})
}

func (c *ChunkWriter) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
}
