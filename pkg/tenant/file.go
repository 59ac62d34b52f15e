package tenant

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"go.yaml.in/yaml/v3"

	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/tokens"
)

// Parse reads a tenants file (YAML, or JSON, which is YAML too):
//
//	tenants:
//	  - id: acme
//	    keys:
//	      - {id: app1, kind: app, secret_sha256: "<hex>"}
//	      - {id: ann, kind: device, device: tel-1, secret: "<plain>"}
//	    quota: {outbox_mib: 64, connections: 1000, event_reads: 8, deliveries_per_second: 1000}
//
// It is strict: an unknown field, a duplicate owner, key or field, an id
// that is not [a-z0-9-]{1,32}, a key with both secret forms or neither, a
// device on a key that is not of kind device, is an error naming the line.
// name starts the messages (the file's path).
func Parse(name string, data []byte) (*Snapshot, error) {
	p := parser{name: name}
	s := &Snapshot{owners: make(map[string]*Tenant), keys: make(map[string]*Key), bound: make(map[string]map[string]bool),
		sum: sha256.Sum256(data)}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if doc.Kind == 0 {
		return nil, fmt.Errorf("%s: the file is empty: it needs a tenants list", name)
	}
	root := doc.Content[0]
	fields, err := p.mapping(root, "the file", "tenants")
	if err != nil {
		return nil, err
	}
	list := fields["tenants"]
	if list == nil {
		return nil, p.errorf(root, "the file has no tenants: (an empty list is written tenants: [])")
	}
	if list.Kind != yaml.SequenceNode {
		return nil, p.errorf(list, "tenants is a list of owners")
	}
	for _, n := range list.Content {
		t, err := p.tenant(n)
		if err != nil {
			return nil, err
		}
		if s.owners[t.ID] != nil {
			return nil, p.errorf(n, "owner %q appears twice", t.ID)
		}
		s.owners[t.ID] = t
		s.Tenants = append(s.Tenants, t)
		for _, k := range t.Keys {
			s.keys[t.ID+"."+k.ID] = k
			if k.Kind == KindDevice {
				if s.bound[t.ID] == nil {
					s.bound[t.ID] = make(map[string]bool)
				}
				s.bound[t.ID][k.Device] = true
			}
		}
	}
	return s, nil
}

type parser struct{ name string }

func (p parser) errorf(n *yaml.Node, format string, args ...any) error {
	return fmt.Errorf("%s: line %d: %s", p.name, n.Line, fmt.Sprintf(format, args...))
}

// mapping returns the fields of n, a mapping that may hold only allowed,
// each at most once.
func (p parser) mapping(n *yaml.Node, what string, allowed ...string) (map[string]*yaml.Node, error) {
	if n.Kind == yaml.AliasNode {
		return nil, p.errorf(n, "%s may not be an alias", what)
	}
	if n.Kind != yaml.MappingNode {
		return nil, p.errorf(n, "%s is a mapping of fields", what)
	}
	out := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, p.errorf(k, "%s has a field whose name is not a string", what)
		}
		known := false
		for _, a := range allowed {
			known = known || a == k.Value
		}
		if !known {
			return nil, p.errorf(k, "%s has an unknown field %q", what, k.Value)
		}
		if out[k.Value] != nil {
			return nil, p.errorf(k, "%s has the field %q twice", what, k.Value)
		}
		if v.Kind == yaml.AliasNode {
			return nil, p.errorf(v, "%s: %s may not be an alias", what, k.Value)
		}
		out[k.Value] = v
	}
	return out, nil
}

// str is the string value of the field name of n.
func (p parser) str(n *yaml.Node, name string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return "", p.errorf(n, "%s is a string", name)
	}
	return n.Value, nil
}

func (p parser) tenant(n *yaml.Node) (*Tenant, error) {
	f, err := p.mapping(n, "an owner", "id", "keys", "quota")
	if err != nil {
		return nil, err
	}
	if f["id"] == nil {
		return nil, p.errorf(n, "an owner needs an id")
	}
	id, err := p.str(f["id"], "id")
	if err != nil {
		return nil, err
	}
	if !validID(id) {
		return nil, p.errorf(f["id"], "owner id %q is not 1 to 32 of a-z, 0-9 and -", id)
	}
	t := &Tenant{ID: id, Quota: DefaultQuota()}
	if q := f["quota"]; q != nil {
		if err := p.quota(q, &t.Quota); err != nil {
			return nil, err
		}
	}
	keys := f["keys"]
	if keys == nil {
		return t, nil // an owner whose keys are all withdrawn
	}
	if keys.Kind != yaml.SequenceNode {
		return nil, p.errorf(keys, "keys is a list of keys")
	}
	seen := make(map[string]bool)
	for _, kn := range keys.Content {
		k, err := p.key(kn, id)
		if err != nil {
			return nil, err
		}
		if seen[k.ID] {
			return nil, p.errorf(kn, "owner %q has the key %q twice", id, k.ID)
		}
		seen[k.ID] = true
		t.Keys = append(t.Keys, k)
	}
	return t, nil
}

func (p parser) key(n *yaml.Node, owner string) (*Key, error) {
	f, err := p.mapping(n, "a key", "id", "kind", "device", "secret", "secret_sha256")
	if err != nil {
		return nil, err
	}
	for _, need := range []string{"id", "kind"} {
		if f[need] == nil {
			return nil, p.errorf(n, "a key needs %s", need)
		}
	}
	k := &Key{Owner: owner}
	if k.ID, err = p.str(f["id"], "id"); err != nil {
		return nil, err
	}
	if !validID(k.ID) {
		return nil, p.errorf(f["id"], "key id %q is not 1 to 32 of a-z, 0-9 and -", k.ID)
	}
	kind, err := p.str(f["kind"], "kind")
	if err != nil {
		return nil, err
	}
	switch k.Kind = Kind(kind); k.Kind {
	case KindApp, KindDevice, KindAgent, KindDeliver:
	default:
		return nil, p.errorf(f["kind"], "kind %q is not app, device, agent or deliver", kind)
	}
	switch d := f["device"]; {
	case k.Kind == KindDevice && d == nil:
		return nil, p.errorf(n, "key %q of kind device needs device: its device id", k.ID)
	case k.Kind != KindDevice && d != nil:
		return nil, p.errorf(d, "key %q of kind %s has a device: only a key of kind device is bound to one", k.ID, k.Kind)
	case d != nil:
		if k.Device, err = p.str(d, "device"); err != nil {
			return nil, err
		}
		if k.Device == "" {
			return nil, p.errorf(d, "device is empty")
		}
		if err := protocol.CheckDeviceID(k.Device); err != nil {
			msg := err.Error()
			if pe, ok := errors.AsType[*protocol.Error](err); ok {
				msg = pe.Message
			}
			return nil, p.errorf(d, "%s", msg)
		}
	}
	plain, hashed := f["secret"], f["secret_sha256"]
	switch {
	case plain != nil && hashed != nil:
		return nil, p.errorf(n, "key %q has both secret and secret_sha256: keep one", k.ID)
	case plain == nil && hashed == nil:
		return nil, p.errorf(n, "key %q needs secret_sha256 (or secret, to try it out)", k.ID)
	case plain != nil:
		// The value may be a secret: never put it in a message.
		if plain.Kind != yaml.ScalarNode || plain.Value == "" {
			return nil, p.errorf(plain, "secret of key %q is not a non-empty string", k.ID)
		}
		k.sum = tokens.Sum(plain.Value)
	default:
		b, err := hex.DecodeString(hashed.Value)
		if hashed.Kind != yaml.ScalarNode || err != nil || len(b) != sha256.Size {
			return nil, p.errorf(hashed, "secret_sha256 of key %q is not 64 hex digits", k.ID)
		}
		copy(k.sum[:], b)
	}
	return k, nil
}

func (p parser) quota(n *yaml.Node, q *Quota) error {
	f, err := p.mapping(n, "quota", "outbox_mib", "connections", "event_reads", "deliveries_per_second")
	if err != nil {
		return err
	}
	for name, dst := range map[string]*int{"outbox_mib": &q.OutboxMiB, "connections": &q.Connections, "event_reads": &q.EventReads,
		"deliveries_per_second": &q.DeliveriesPerSecond} {
		v := f[name]
		if v == nil {
			continue
		}
		i, err := strconv.Atoi(v.Value)
		if v.Kind != yaml.ScalarNode || v.Tag != "!!int" || err != nil || i < 1 {
			return p.errorf(v, "quota %s is a whole number of at least 1", name)
		}
		*dst = i
	}
	return nil
}

// errNoFile is what Open says of an empty path.
var errNoFile = errors.New("tenant: no tenants file")
