package memstore

import (
	"bufio"
	"bytes"
	"math"
	"os"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
)

// What the outboxes cost in memory, beyond the bytes of the items: the
// structures that keep each item (its outboxItem, its slots in its
// device's queue and in the deadline heap, which grow by doubling), each
// device with items (its queue and map entry, its id), each holding (a
// device within a share) and each share. Measured with
// TestOutboxCostMatchesHeap: the heap a full outbox pool takes, after a
// collection, is within a few percent of the cost counted, for items of 1
// byte to 64 KiB, one device each or a thousand per device.
const (
	itemOverhead    = 136
	deviceOverhead  = 128
	holdingCost     = 120
	shareOverhead   = 320
	outboxCostFloor = 16 << 20
)

// itemCost is what an item costs: its bytes as allocated (bytes.Clone
// rounds the capacity up to the allocator's size class) and its overhead.
func itemCost(data []byte) int64 { return int64(cap(data)) + itemOverhead }

func deviceCost(device string) int64 { return deviceOverhead + int64(len(device)) }

func shareCost(name string) int64 { return shareOverhead + int64(len(name)) }

// DefaultMaxOutboxBytes is the memory bound of the outboxes when
// Options.MaxOutboxBytes is zero: an eighth of the memory available to
// the process, at most 1 GiB, at least 16 MiB; 256 MiB when it cannot be
// told. Available is the least of the cgroup's memory.max (v2, or v1's
// memory.limit_in_bytes) of the process and of its parents, the machine's
// memory (MemTotal) and the Go runtime's memory limit (GOMEMLIMIT), when
// set. An eighth, because the heap the outboxes take at their bound
// (counted within a few percent) is not all a process's memory: the Go
// collector lets the heap grow to twice what is live before it collects
// (GOGC=100), and a burst of pushes makes garbage of its own.
func DefaultMaxOutboxBytes() int64 { return outboxBytesFor(availableMemory()) }

// outboxBytesFor is DefaultMaxOutboxBytes for avail bytes available (0:
// unknown).
func outboxBytesFor(avail int64) int64 {
	if avail <= 0 {
		return 256 << 20
	}
	return min(max(avail/8, outboxCostFloor), 1<<30)
}

// availableMemory is the memory the process may use, or 0 when unknown.
func availableMemory() int64 {
	var avail int64
	least := func(n int64) {
		if n > 0 && (avail == 0 || n < avail) {
			avail = n
		}
	}
	least(memTotal())
	if data, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		least(cgroupLimit(data, "/sys/fs/cgroup"))
	}
	if lim := debug.SetMemoryLimit(-1); lim != math.MaxInt64 {
		least(lim)
	}
	return avail
}

// memTotal is the machine's memory from /proc/meminfo, or 0.
func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// cgroupLimit is the least memory limit of the cgroups that procCgroup
// (/proc/self/cgroup) names and of their parents, under the cgroup file
// system mounted at mount; 0 when none is set or none can be read.
func cgroupLimit(procCgroup []byte, mount string) int64 {
	var limit int64
	least := func(n int64) {
		if n > 0 && (limit == 0 || n < limit) {
			limit = n
		}
	}
	for line := range bytes.Lines(procCgroup) {
		// "hierarchy-ID:controllers:path": "0::/path" on cgroup v2, a
		// line naming "memory" on v1.
		parts := strings.SplitN(strings.TrimSpace(string(line)), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var root, file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			root, file = mount, "memory.max"
		case strings.Contains(","+parts[1]+",", ",memory,"):
			root, file = path.Join(mount, "memory"), "memory.limit_in_bytes"
		default:
			continue
		}
		// In a container the process's own cgroup is often mounted as
		// the root, so the root's file counts too.
		for p := path.Clean("/" + parts[2]); ; p = path.Dir(p) {
			least(readLimit(path.Join(root, p, file)))
			if p == "/" {
				break
			}
		}
	}
	return limit
}

// readLimit reads a cgroup memory limit: 0 for "max", a v1 limit that
// stands for none (near the largest int64) or a file that cannot be read.
func readLimit(file string) int64 {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil || n >= math.MaxInt64/2 {
		return 0
	}
	return n
}
