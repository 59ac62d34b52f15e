package client

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gobwas/ws"
)

// writeChunk is how much payload is masked and written per write call: a
// 16 MiB frame does not need a 16 MiB copy.
const writeChunk = 64 << 10

// maxHeaderSize is the size of a masked frame header with a 64-bit length.
const maxHeaderSize = 14

// smallWrite is the largest write buffer a Conn keeps for itself; larger
// writes borrow a writeChunk buffer from chunkPool, so that thousands of idle
// connections of a load generator do not each hold 64 KiB.
const smallWrite = 4 << 10

var chunkPool = sync.Pool{New: func() any {
	b := make([]byte, maxHeaderSize+writeChunk)
	return &b
}}

// errPartialFrame is returned by a send while a frame announced by
// SendHeaderOnly still waits for its payload.
var errPartialFrame = errors.New("client: a frame announced by SendHeaderOnly is incomplete")

// Send JSON-encodes v (encoding/json, without HTML escaping) and sends it as
// one text message.
func (c *Conn) Send(v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("client: encode frame: %w", err)
	}
	return c.writeMessage(ws.OpText, bytes.TrimSuffix(b.Bytes(), []byte("\n")))
}

// SendRaw sends data, whatever it is (broken JSON, invalid UTF-8, 16 MiB),
// as one text frame. The server's answer is read meanwhile: a server that
// replies and closes while the frame is being written makes SendRaw return an
// error, and its frames are still delivered.
func (c *Conn) SendRaw(data []byte) error { return c.writeMessage(ws.OpText, data) }

// SendBinary sends data as one binary frame.
func (c *Conn) SendBinary(data []byte) error { return c.writeMessage(ws.OpBinary, data) }

// SendFragmented sends data as one text message split into pieces frames (a
// text frame and continuation frames), as even as possible; a piece may be
// empty, and a piece boundary may cut a UTF-8 sequence, both of which the
// WebSocket protocol allows. Nothing else is sent between the pieces but
// pongs.
func (c *Conn) SendFragmented(data []byte, pieces int) error {
	if pieces < 1 {
		pieces = 1
	}
	if err := c.lockWrite(c.writeTimeout); err != nil {
		return err
	}
	defer c.unlockWrite()
	if c.partialLeft > 0 {
		return errPartialFrame
	}
	size, extra := len(data)/pieces, len(data)%pieces
	off := 0
	for i := range pieces {
		n := size
		if i < extra {
			n++
		}
		op := ws.OpContinuation
		if i == 0 {
			op = ws.OpText
		}
		if err := c.writeFrameLocked(op, i == pieces-1, data[off:off+n]); err != nil {
			return err
		}
		off += n
		if i < pieces-1 {
			// Control frames may go between the fragments of a message.
			if err := c.flushControlLocked(); err != nil {
				return err
			}
		}
	}
	return nil
}

// SendHeaderOnly writes the header of a final text frame announcing length
// bytes of payload, and no payload. SendPayload writes the payload, in as many
// calls as wanted; until all of it is written every other send fails (pongs
// wait). A test announcing 16 MiB + 1 can so send only a few bytes of them and
// see how the server reacts to the header alone.
func (c *Conn) SendHeaderOnly(length int64) error {
	if length < 0 {
		return fmt.Errorf("client: negative frame length %d", length)
	}
	if err := c.lockWrite(c.writeTimeout); err != nil {
		return err
	}
	defer c.unlockWrite()
	if c.partialLeft > 0 {
		return errPartialFrame
	}
	mask := ws.NewMask()
	var hdr [maxHeaderSize]byte
	n := putHeader(hdr[:], ws.OpText, true, length, mask)
	if _, err := c.conn.Write(hdr[:n]); err != nil {
		return c.failLocked(err)
	}
	c.partialLeft, c.partialOff, c.partialMask = length, 0, mask
	return nil
}

// SendPayload writes the next bytes of the frame announced by SendHeaderOnly.
// It fails if data is longer than what the header still owes.
func (c *Conn) SendPayload(data []byte) error {
	if err := c.lockWrite(c.writeTimeout); err != nil {
		return err
	}
	defer c.unlockWrite()
	if int64(len(data)) > c.partialLeft {
		return fmt.Errorf("client: %d payload bytes, but the announced frame owes only %d", len(data), c.partialLeft)
	}
	if err := c.writeMaskedLocked(nil, data, c.partialMask, c.partialOff); err != nil {
		return err
	}
	c.partialLeft -= int64(len(data))
	c.partialOff += int64(len(data))
	return nil
}

// writeMessage sends p as one final frame.
func (c *Conn) writeMessage(op ws.OpCode, p []byte) error {
	if err := c.lockWrite(c.writeTimeout); err != nil {
		return err
	}
	defer c.unlockWrite()
	if c.partialLeft > 0 {
		return errPartialFrame
	}
	return c.writeFrameLocked(op, true, p)
}

// lockWrite takes the write side and arms the write deadline.
func (c *Conn) lockWrite(timeout time.Duration) error {
	c.wmu.Lock()
	if err := c.writableLocked(); err != nil {
		c.wmu.Unlock()
		return err
	}
	c.armLocked(timeout)
	return nil
}

func (c *Conn) writableLocked() error {
	if c.werr != nil {
		return c.werr
	}
	if c.closeSent || c.closed.Load() {
		return ErrClosed
	}
	return nil
}

func (c *Conn) armLocked(timeout time.Duration) {
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	_ = c.conn.SetWriteDeadline(deadline)
}

// unlockWrite writes the control frames queued meanwhile and releases the
// write side. A control frame queued by another goroutine after our flush is
// written either by us, here, or by whoever holds the lock next.
func (c *Conn) unlockWrite() {
	for {
		if c.partialLeft > 0 {
			// No control frame may go in the middle of a frame: SendPayload
			// flushes them when the frame is complete.
			c.wmu.Unlock()
			return
		}
		_ = c.flushControlLocked()
		c.wmu.Unlock()
		if !c.hasControl() || !c.wmu.TryLock() {
			return
		}
		c.armLocked(c.writeTimeout)
	}
}

// queueControl queues a control frame for the write side.
func (c *Conn) queueControl(op ws.OpCode, p []byte) {
	c.ctlMu.Lock()
	c.ctl = append(c.ctl, control{op, p})
	c.ctlMu.Unlock()
}

// queueClose queues a close frame with body p, unless one already is; it
// reports whether it did.
func (c *Conn) queueClose(p []byte) bool {
	if !c.closeQueued.CompareAndSwap(false, true) {
		return false
	}
	c.queueControl(ws.OpClose, p)
	return true
}

func (c *Conn) hasControl() bool {
	c.ctlMu.Lock()
	defer c.ctlMu.Unlock()
	return len(c.ctl) > 0
}

// flushControl writes the queued control frames if the write side is free;
// if it is not, its holder writes them. It never waits for a writer, so the
// reader goroutine can call it.
func (c *Conn) flushControl() {
	if !c.wmu.TryLock() {
		return
	}
	c.armLocked(controlWriteTimeout)
	c.unlockWrite()
}

// flushControlLocked writes the queued control frames. Nothing is written
// after a close frame.
func (c *Conn) flushControlLocked() error {
	c.ctlMu.Lock()
	queued := c.ctl
	c.ctl = nil
	c.ctlMu.Unlock()
	for _, f := range queued {
		if c.closeSent || c.werr != nil || c.closed.Load() {
			return c.writableLocked()
		}
		if err := c.writeFrameLocked(f.op, true, f.p); err != nil {
			return err
		}
		if f.op == ws.OpClose {
			c.closeSent = true
		}
	}
	return nil
}

// writeFrameLocked writes one masked frame.
func (c *Conn) writeFrameLocked(op ws.OpCode, fin bool, p []byte) error {
	mask := ws.NewMask()
	var hdr [maxHeaderSize]byte
	n := putHeader(hdr[:], op, fin, int64(len(p)), mask)
	return c.writeMaskedLocked(hdr[:n], p, mask, 0)
}

// writeMaskedLocked writes prefix and then p masked with mask, p starting at
// offset off of its frame's payload.
func (c *Conn) writeMaskedLocked(prefix, p []byte, mask [4]byte, off int64) error {
	var buf []byte
	if need := maxHeaderSize + min(len(p), writeChunk); need <= smallWrite {
		if cap(c.wbuf) < need {
			c.wbuf = make([]byte, max(need, 512))
		}
		buf = c.wbuf[:cap(c.wbuf)]
	} else {
		bp := chunkPool.Get().(*[]byte)
		defer chunkPool.Put(bp)
		buf = *bp
	}
	n := copy(buf, prefix)
	for first := true; first || len(p) > 0; first = false {
		k := copy(buf[n:], p[:min(len(p), writeChunk)])
		ws.Cipher(buf[n:n+k], mask, int(off))
		if _, err := c.conn.Write(buf[:n+k]); err != nil {
			return c.failLocked(err)
		}
		p, off, n = p[k:], off+int64(k), 0
	}
	return nil
}

// failLocked makes a write error sticky: after a partial write the stream
// cannot be resumed.
func (c *Conn) failLocked(err error) error {
	if c.closed.Load() {
		err = fmt.Errorf("%w: %v", ErrClosed, err)
	} else {
		err = fmt.Errorf("client: write: %w", err)
	}
	c.werr = err
	c.ctlMu.Lock()
	c.ctl = nil
	c.ctlMu.Unlock()
	return err
}

// putHeader encodes a masked frame header into b and returns its size.
func putHeader(b []byte, op ws.OpCode, fin bool, length int64, mask [4]byte) int {
	b[0] = byte(op)
	if fin {
		b[0] |= 0x80
	}
	var n int
	switch {
	case length <= 125:
		b[1] = byte(length)
		n = 2
	case length <= 0xffff:
		b[1] = 126
		binary.BigEndian.PutUint16(b[2:], uint16(length))
		n = 4
	default:
		b[1] = 127
		binary.BigEndian.PutUint64(b[2:], uint64(length))
		n = 10
	}
	b[1] |= 0x80
	return n + copy(b[n:], mask[:])
}
