package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// Replies of putPartScript: its first element.
const (
	partStored    = 0  // the part is buffered
	partWhole     = 1  // the part is a whole file: nothing was buffered
	partCompleted = 2  // then the meta and every part in index order
	partBadIndex  = -1 // then nothing
	partBadCount  = -2 // then the upload's count
	partFileBig   = -3 // then the file's bytes
	partTooMany   = -4 // then the device's open uploads
	partDeviceBig = -5 // then the device's bytes
)

// putPartScript stores one part under the device's limits, as memstore does;
// see PutPart. It first forgets the uploads whose buffer expired, so the
// device's accounting heals by itself.
//
// KEYS: uploads hash of the device, buffer of this upload.
// ARGV: upload name, index, count, data, meta, MaxOpen, MaxFileBytes,
// MaxBytes, ttl ms, buffer key prefix of the device.
var putPartScript = redis.NewScript(`
local dev, buf = KEYS[1], KEYS[2]
local name, field = ARGV[1], ARGV[2]
local index, count = tonumber(ARGV[2]), tonumber(ARGV[3])
local data, meta = ARGV[4], ARGV[5]
local maxOpen, maxFile, maxBytes = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local ttl, bufPrefix = ARGV[9], ARGV[10]

-- mine: the bytes of this upload, nil when it is not open; open and total:
-- the other live uploads of the device and their bytes.
local mine, open, total = nil, 0, 0
local entries = redis.call('HGETALL', dev)
for i = 1, #entries, 2 do
	local f, n = entries[i], tonumber(entries[i + 1])
	if redis.call('EXISTS', bufPrefix .. f) == 0 then
		redis.call('HDEL', dev, f)
	elseif f == name then
		mine = n
	else
		open, total = open + 1, total + n
	end
end
if mine == nil then
	redis.call('DEL', buf) -- a buffer the device no longer lists
end

local function discard()
	if mine ~= nil then
		redis.call('DEL', buf)
		redis.call('HDEL', dev, name)
	end
end

if count < 1 or index < 0 or index >= count then
	discard()
	return {-1}
end
local old, received = 0, 1
if mine ~= nil then
	local c = tonumber(redis.call('HGET', buf, 'count'))
	if c ~= count then
		discard()
		return {-2, c}
	end
	received = redis.call('HLEN', buf) - 2 -- count and meta are not parts
	if redis.call('HEXISTS', buf, field) == 1 then
		old = redis.call('HSTRLEN', buf, field)
	else
		received = received + 1
	end
end
local fileBytes = (mine or 0) + #data - old
if fileBytes > maxFile then
	discard()
	return {-3, fileBytes}
end

if received == count then
	if mine == nil then
		return {1}
	end
	local out = {2, redis.call('HGET', buf, 'meta')}
	for i = 0, count - 1 do
		if i == index then
			out[#out + 1] = data
		else
			out[#out + 1] = redis.call('HGET', buf, tostring(i))
		end
	end
	discard()
	return out
end

if mine == nil and open >= maxOpen then
	return {-4, open}
end
if total + fileBytes > maxBytes then
	discard()
	return {-5, total + fileBytes}
end
if mine == nil then
	redis.call('HSET', buf, 'count', ARGV[3], 'meta', meta)
end
redis.call('HSET', buf, field, data)
redis.call('HSET', dev, name, fileBytes)
redis.call('PEXPIRE', buf, ttl)
redis.call('PEXPIRE', dev, ttl)
return {0}
`)

// dropUploadsScript frees the uploads of one connection.
// KEYS: uploads hash of the device. ARGV: connPrefix, buffer key prefix.
var dropUploadsScript = redis.NewScript(`
local names = redis.call('HKEYS', KEYS[1])
for _, f in ipairs(names) do
	if string.sub(f, 1, #ARGV[1]) == ARGV[1] then
		redis.call('DEL', ARGV[2] .. f)
		redis.call('HDEL', KEYS[1], f)
	end
end
return 0
`)

// uploadBytesScript sums the bytes of the device's live uploads.
// KEYS: uploads hash of the device. ARGV: buffer key prefix.
var uploadBytesScript = redis.NewScript(`
local total = 0
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
	if redis.call('EXISTS', ARGV[1] .. entries[i]) == 1 then
		total = total + tonumber(entries[i + 1])
	end
end
return total
`)

// PutPart stores p under lim; see store.Uploads. The limits are checked as
// memstore checks them, atomically for every node:
//   - the file's bytes, p included, must not exceed MaxFileBytes;
//   - a part that completes its file is returned at once, so it does not
//     count against MaxOpen or MaxBytes;
//   - otherwise a new upload needs fewer than MaxOpen open uploads, and the
//     device's bytes, p included, must not exceed MaxBytes.
//
// Count < 1 or an Index outside [0, Count) is store.ErrUploadMismatch. Uploads
// are keyed by device, connection and file id. An unfinished upload expires
// Options.UploadTTL after its last part.
func (s *Store) PutPart(ctx context.Context, p store.Part, lim store.UploadLimits) (*store.Upload, error) {
	if err := ctx.Err(); err != nil {
		return nil, opErr("PutPart", err)
	}
	name := uploadName(p.Conn, p.ID)
	prefix := s.uploadKeyPrefix(p.Device)
	r, err := putPartScript.Run(ctx, s.rdb, []string{s.uploadsKey(p.Device), prefix + name},
		name, p.Index, p.Count, p.Data, p.Meta,
		lim.MaxOpen, lim.MaxFileBytes, lim.MaxBytes, ms(s.uploadTTL), prefix).Slice()
	if err != nil {
		return nil, s.redisErr(ctx, "PutPart", err)
	}
	code, err := replyInt(r, 0)
	if err != nil {
		return nil, opErr("PutPart", err)
	}
	detail := func() int64 { n, _ := replyInt(r, 1); return n }
	switch code {
	case partStored:
		return nil, nil
	case partWhole:
		return &store.Upload{Meta: clone(p.Meta), Data: clone(p.Data)}, nil
	case partCompleted:
		return assemble(r[1:])
	case partBadIndex:
		return nil, fmt.Errorf("%w: part %d of %d", store.ErrUploadMismatch, p.Index, p.Count)
	case partBadCount:
		return nil, fmt.Errorf("%w: %d parts, the upload has %d", store.ErrUploadMismatch, p.Count, detail())
	case partFileBig:
		return nil, fmt.Errorf("%w: file of %d bytes, limit %d", store.ErrUploadTooBig, detail(), lim.MaxFileBytes)
	case partTooMany:
		return nil, fmt.Errorf("%w: %d open, limit %d", store.ErrTooManyUploads, detail(), lim.MaxOpen)
	case partDeviceBig:
		return nil, fmt.Errorf("%w: device buffers of %d bytes, limit %d", store.ErrUploadTooBig, detail(), lim.MaxBytes)
	}
	return nil, opErr("PutPart", fmt.Errorf("unknown script reply %d", code))
}

// assemble joins the meta and parts that putPartScript returned.
func assemble(r []any) (*store.Upload, error) {
	meta, err := replyBytes(r, 0)
	if err != nil {
		return nil, opErr("PutPart", err)
	}
	size := 0
	for _, part := range r[1:] {
		str, ok := part.(string)
		if !ok {
			return nil, opErr("PutPart", fmt.Errorf("script returned a part of type %T", part))
		}
		size += len(str)
	}
	data := make([]byte, 0, size)
	for _, part := range r[1:] {
		data = append(data, part.(string)...)
	}
	return &store.Upload{Meta: clone(meta), Data: data}, nil
}

// clone copies b; nil when b is empty.
func clone(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// DropUploads frees every unfinished upload that conn holds for device.
func (s *Store) DropUploads(ctx context.Context, device, conn string) error {
	if err := ctx.Err(); err != nil {
		return opErr("DropUploads", err)
	}
	err := dropUploadsScript.Run(ctx, s.rdb, []string{s.uploadsKey(device)}, connPrefix(conn), s.uploadKeyPrefix(device)).Err()
	if err != nil {
		return s.redisErr(ctx, "DropUploads", err)
	}
	return nil
}

// UploadBytes reports the bytes buffered for device; expired uploads do not
// count.
func (s *Store) UploadBytes(ctx context.Context, device string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, opErr("UploadBytes", err)
	}
	n, err := uploadBytesScript.Run(ctx, s.rdb, []string{s.uploadsKey(device)}, s.uploadKeyPrefix(device)).Int64()
	if err != nil {
		return 0, s.redisErr(ctx, "UploadBytes", err)
	}
	return int(n), nil
}
