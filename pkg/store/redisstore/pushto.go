package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// SetPushTarget records target for device for ttl (P pushto:{D}).
func (s *Store) SetPushTarget(ctx context.Context, device string, target []byte, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return opErr("SetPushTarget", err)
	}
	if ttl <= 0 {
		return errBadTTL
	}
	if err := s.rdb.Set(ctx, s.pushToKey(device), target, time.Duration(ms(ttl))*time.Millisecond).Err(); err != nil {
		return s.redisErr(ctx, "SetPushTarget", err)
	}
	return nil
}

// PushTarget returns device's target; store.ErrNotFound when none.
func (s *Store) PushTarget(ctx context.Context, device string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, opErr("PushTarget", err)
	}
	b, err := s.rdb.Get(ctx, s.pushToKey(device)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, s.redisErr(ctx, "PushTarget", err)
	}
	return b, nil
}

// DeletePushTarget forgets device's target.
func (s *Store) DeletePushTarget(ctx context.Context, device string) error {
	if err := ctx.Err(); err != nil {
		return opErr("DeletePushTarget", err)
	}
	if err := s.rdb.Del(ctx, s.pushToKey(device)).Err(); err != nil {
		return s.redisErr(ctx, "DeletePushTarget", err)
	}
	return nil
}

// pushToKey holds d's registered push endpoint.
func (s *Store) pushToKey(d string) string { return s.prefix + "pushto:{" + d + "}" }
