package memstore

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// uploadKey names an upload: the same file id on two connections of one
// device (an old socket and the one that took over) is two uploads, so that
// DropUploads for the old connection cannot free the new one's parts.
type uploadKey struct{ conn, id string }

// upload is one unfinished file.
type upload struct {
	count int            // parts of the file
	meta  []byte         // from the first part stored
	parts map[int][]byte // by index; a map, so a huge Count costs nothing up front
	bytes int            // sum of len(parts)
}

// deviceUploads is the open uploads of one device.
type deviceUploads struct {
	bytes int // sum of the uploads' bytes
	open  map[uploadKey]*upload
}

// uploads buffers multi-part uploads. Uploads do not expire: they end by
// completion, by a broken limit or by DropUploads when the socket closes.
type uploads struct {
	mu      sync.Mutex
	devices map[string]*deviceUploads // only devices with open uploads
}

func newUploads() uploads {
	return uploads{devices: make(map[string]*deviceUploads)}
}

// PutPart stores p under lim; see store.Uploads. The limits are checked
// against the state p would leave behind:
//   - the file's bytes, p included, must not exceed MaxFileBytes;
//   - a part that completes its file is returned at once, so it does not
//     count against MaxOpen or MaxBytes;
//   - otherwise a new upload needs fewer than MaxOpen open uploads, and the
//     device's bytes, p included, must not exceed MaxBytes.
//
// Count < 1 or an Index outside [0, Count) is store.ErrUploadMismatch. Uploads
// are keyed by device, connection and file id.
func (s *Store) PutPart(ctx context.Context, p store.Part, lim store.UploadLimits) (*store.Upload, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	data := bytes.Clone(p.Data)
	u := &s.uploads
	u.mu.Lock()
	defer u.mu.Unlock()

	dev := u.devices[p.Device]
	if dev == nil {
		dev = &deviceUploads{open: make(map[uploadKey]*upload)}
		u.devices[p.Device] = dev
	}
	defer u.forgetIdleLocked(p.Device, dev)

	key := uploadKey{conn: p.Conn, id: p.ID}
	up := dev.open[key]
	if p.Count < 1 || p.Index < 0 || p.Index >= p.Count {
		dev.discard(key)
		return nil, fmt.Errorf("%w: part %d of %d", store.ErrUploadMismatch, p.Index, p.Count)
	}
	if up != nil && up.count != p.Count {
		dev.discard(key)
		return nil, fmt.Errorf("%w: %d parts, the upload has %d", store.ErrUploadMismatch, p.Count, up.count)
	}

	replaced, received, fileBytes := 0, 0, 0
	if up != nil {
		old, ok := up.parts[p.Index]
		if ok {
			replaced = len(old)
		}
		received, fileBytes = len(up.parts), up.bytes
		if !ok {
			received++
		}
	} else {
		received = 1
	}
	fileBytes += len(data) - replaced
	if fileBytes > lim.MaxFileBytes {
		dev.discard(key)
		return nil, fmt.Errorf("%w: file of %d bytes, limit %d", store.ErrUploadTooBig, fileBytes, lim.MaxFileBytes)
	}

	if received == p.Count {
		if up == nil {
			return &store.Upload{Meta: bytes.Clone(p.Meta), Data: data}, nil
		}
		dev.discard(key)
		return assemble(up, p.Index, data, fileBytes), nil
	}

	if up == nil && len(dev.open) >= lim.MaxOpen {
		return nil, fmt.Errorf("%w: %d open, limit %d", store.ErrTooManyUploads, len(dev.open), lim.MaxOpen)
	}
	if total := dev.bytes + len(data) - replaced; total > lim.MaxBytes {
		dev.discard(key)
		return nil, fmt.Errorf("%w: device buffers of %d bytes, limit %d", store.ErrUploadTooBig, total, lim.MaxBytes)
	}
	if up == nil {
		up = &upload{count: p.Count, meta: bytes.Clone(p.Meta), parts: make(map[int][]byte)}
		dev.open[key] = up
	}
	up.parts[p.Index] = data
	up.bytes = fileBytes
	dev.bytes += len(data) - replaced
	return nil, nil
}

// assemble joins up's parts and its last part (index, data) in index order
// into a file of size bytes.
func assemble(up *upload, index int, data []byte, size int) *store.Upload {
	out := make([]byte, 0, size)
	for i := range up.count {
		if i == index {
			out = append(out, data...)
		} else {
			out = append(out, up.parts[i]...)
		}
	}
	return &store.Upload{Meta: up.meta, Data: out}
}

// discard frees the upload key if it is open.
func (d *deviceUploads) discard(key uploadKey) {
	if up, ok := d.open[key]; ok {
		d.bytes -= up.bytes
		delete(d.open, key)
	}
}

// forgetIdleLocked drops the entry of a device without open uploads.
func (u *uploads) forgetIdleLocked(device string, dev *deviceUploads) {
	if len(dev.open) == 0 {
		delete(u.devices, device)
	}
}

// DropUploads frees every unfinished upload that conn holds for device.
func (s *Store) DropUploads(ctx context.Context, device, conn string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	u := &s.uploads
	u.mu.Lock()
	defer u.mu.Unlock()
	dev := u.devices[device]
	if dev == nil {
		return nil
	}
	for key := range dev.open {
		if key.conn == conn {
			dev.discard(key)
		}
	}
	u.forgetIdleLocked(device, dev)
	return nil
}

// UploadBytes reports the bytes buffered for device.
func (s *Store) UploadBytes(ctx context.Context, device string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	u := &s.uploads
	u.mu.Lock()
	defer u.mu.Unlock()
	if dev := u.devices[device]; dev != nil {
		return dev.bytes, nil
	}
	return 0, nil
}
