// Package harness is what the Go client programs share: the spec they read (one JSON argument), the records they
// produce, the result they print (one JSON object on stdout) and the wait for a consumer group to settle.
//
// The records: record i (0 <= i < Spec.Records) has key "k-<i>", value "v-<i>" (null for every 7th), one header
// "h" = "<i>" and timestamp Spec.BaseMs+i, where the client and the message format carry headers and timestamps.
// tests/integration/test_go_rust_clients.py checks what comes back against the same rule.
package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Spec is the program's one argument.
type Spec struct {
	Bootstrap  string `json:"bootstrap"`
	Topic      string `json:"topic"`
	Partitions int    `json:"partitions"`
	Records    int    `json:"records"`
	Group      string `json:"group"`
	Members    int    `json:"members"`     // consumers in the group; 0: no group membership, offsets committed alone
	Version    string `json:"version"`     // sarama's Config.Version ("0.10.2.0"); "" keeps the client's default
	Create     bool   `json:"create"`      // create the topic with the client's admin API (else it exists)
	TimeoutS   int    `json:"timeout_s"`   // the whole run
	BaseMs     int64  `json:"base_ms"`     // timestamp of record 0
	Compressed string `json:"compression"` // the producer's codec, where the client has the option
}

// Rec is a record as produced (where the client says it went) or as consumed.
type Rec struct {
	Partition int32             `json:"partition"`
	Offset    int64             `json:"offset"`
	Key       string            `json:"key"`
	Value     *string           `json:"value"`
	Headers   map[string]string `json:"headers,omitempty"`
	Timestamp int64             `json:"timestamp"`
	Member    int               `json:"member"`
}

// Member is one group member's view at the end: its id, generation and the partitions it was assigned.
type Member struct {
	Index      int     `json:"index"`
	MemberID   string  `json:"member_id"`
	Generation int32   `json:"generation"`
	Assigned   []int32 `json:"assigned"`
}

// GroupDescription is DescribeGroups' answer, as the client's admin API gives it.
type GroupDescription struct {
	State        string   `json:"state"`
	ProtocolType string   `json:"protocol_type"`
	Protocol     string   `json:"protocol"`
	Members      []Member `json:"members"`
}

// Result is what the program prints.
type Result struct {
	Client     string            `json:"client"`
	Module     string            `json:"module"`
	Version    string            `json:"version,omitempty"`
	Topics     map[string]int    `json:"topics"` // topic -> partitions, as the client's metadata or admin listed it
	Created    bool              `json:"created"`
	Produced   []Rec             `json:"produced"`
	Consumed   []Rec             `json:"consumed"`
	Members    []Member          `json:"members"`
	Committed  map[string]int64  `json:"committed"`   // partition -> offset, read back by the client
	EndOffsets map[string]int64  `json:"end_offsets"` // partition -> end offset, as the client listed it
	Group      *GroupDescription `json:"group,omitempty"`
	Steps      []string          `json:"steps"`
	Error      string            `json:"error,omitempty"`
	Seconds    float64           `json:"seconds"`
	mu         sync.Mutex
}

// Read parses os.Args[1] into a Spec with defaults filled in.
func Read() Spec {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: PROGRAM JSON-SPEC")
		os.Exit(2)
	}
	var s Spec
	if err := json.Unmarshal([]byte(os.Args[1]), &s); err != nil {
		fmt.Fprintln(os.Stderr, "spec:", err)
		os.Exit(2)
	}
	if s.Partitions == 0 {
		s.Partitions = 3
	}
	if s.Records == 0 {
		s.Records = 30
	}
	if s.TimeoutS == 0 {
		s.TimeoutS = 90
	}
	if s.BaseMs == 0 {
		s.BaseMs = time.Now().Add(-time.Hour).UnixMilli()
	}
	if s.Group == "" {
		s.Group = s.Topic + "-group"
	}
	return s
}

// Key, Value, Header of record i.
func Key(i int) string { return "k-" + strconv.Itoa(i) }

func Value(i int) *string {
	if i%7 == 6 {
		return nil
	}
	v := "v-" + strconv.Itoa(i)
	return &v
}

func Header(i int) string { return strconv.Itoa(i) }

// ModuleVersion is the version of the module that holds the package path prefix, from the build info.
func ModuleVersion(path string) string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, dep := range info.Deps {
		if dep.Path == path {
			return dep.Version
		}
	}
	return ""
}

// New starts a result.
func New(client, module string) *Result {
	return &Result{Client: client, Module: module, Topics: map[string]int{}, Produced: []Rec{}, Consumed: []Rec{},
		Members: []Member{}, Committed: map[string]int64{}, EndOffsets: map[string]int64{}, Steps: []string{}}
}

// Step notes a step done (which shows how far a failed run got).
func (r *Result) Step(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Steps = append(r.Steps, fmt.Sprintf(format, args...))
}

// AddConsumed keeps a consumed record; the count after it.
func (r *Result) AddConsumed(rec Rec) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Consumed = append(r.Consumed, rec)
	return len(r.Consumed)
}

func (r *Result) ConsumedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.Consumed)
}

// Finish prints the result as JSON (err, if any, in "error") and exits: 0 without an error, 1 with one.
func (r *Result) Finish(started time.Time, err error) {
	r.Seconds = time.Since(started).Seconds()
	if err != nil {
		r.Error = err.Error()
	}
	sort.Slice(r.Consumed, func(a, b int) bool {
		ca, cb := r.Consumed[a], r.Consumed[b]
		if ca.Partition != cb.Partition {
			return ca.Partition < cb.Partition
		}
		return ca.Offset < cb.Offset
	})
	out, merr := json.Marshal(r)
	if merr != nil {
		fmt.Fprintln(os.Stderr, "result:", merr)
		os.Exit(3)
	}
	fmt.Println(string(out))
	if err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}

// P is a partition as a JSON object key.
func P(p int32) string { return strconv.Itoa(int(p)) }

// Tracker follows the members of a group: who holds which partitions in which generation.
type Tracker struct {
	mu      sync.Mutex
	members []Member
	changed time.Time
}

func NewTracker(n int) *Tracker {
	t := &Tracker{members: make([]Member, n), changed: time.Now()}
	for i := range t.members {
		t.members[i].Index = i
		t.members[i].Assigned = []int32{}
	}
	return t
}

// Set records member i's assignment in a generation (an empty one when its partitions are revoked).
func (t *Tracker) Set(i int, memberID string, generation int32, assigned []int32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	parts := append([]int32{}, assigned...)
	sort.Slice(parts, func(a, b int) bool { return parts[a] < parts[b] })
	t.members[i] = Member{Index: i, MemberID: memberID, Generation: generation, Assigned: parts}
	t.changed = time.Now()
}

// Members is a copy of every member's last assignment.
func (t *Tracker) Members() []Member {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Member, len(t.members))
	copy(out, t.members)
	return out
}

// Holds reports whether member i holds partition p now.
func (t *Tracker) Holds(i int, p int32) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, q := range t.members[i].Assigned {
		if q == p {
			return true
		}
	}
	return false
}

// WaitStable waits until every member holds at least one partition, all in one generation, each partition of
// the topic held by exactly one member, and nothing changed for `quiet`.
func (t *Tracker) WaitStable(ctx context.Context, partitions int, quiet time.Duration) error {
	for {
		if reason := t.unstable(partitions, quiet); reason == "" {
			return nil
		} else if ctx.Err() != nil {
			return fmt.Errorf("the group did not settle: %s", reason)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (t *Tracker) unstable(partitions int, quiet time.Duration) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	held := map[int32]int{}
	var why []string
	for _, m := range t.members {
		if len(m.Assigned) == 0 {
			why = append(why, fmt.Sprintf("member %d holds nothing", m.Index))
		}
		if m.Generation != t.members[0].Generation {
			why = append(why, fmt.Sprintf("member %d in generation %d, member 0 in %d", m.Index, m.Generation,
				t.members[0].Generation))
		}
		for _, p := range m.Assigned {
			held[p]++
		}
	}
	for p := 0; p < partitions; p++ {
		if held[int32(p)] != 1 {
			why = append(why, fmt.Sprintf("partition %d held %d times", p, held[int32(p)]))
		}
	}
	if len(why) == 0 && time.Since(t.changed) < quiet {
		why = append(why, "changed just now")
	}
	return strings.Join(why, "; ")
}

// ErrTimeout is returned when the run's deadline passes before all records are consumed.
var ErrTimeout = errors.New("timed out")

// WaitFor polls cond until it holds or ctx ends.
func WaitFor(ctx context.Context, what string, cond func() bool) error {
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w waiting for %s", ErrTimeout, what)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
