package shm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The spec test: docs/SHM.md is the one place the layout's numbers come
// from. It is parsed here, and both implementations are held to it: the Go
// structs (by reflection) and the C header uap-c/tpsched_uap.h (by a C
// program generated from the same tables, made of _Static_assert on
// offsetof and sizeof, compiled and run). A field that moves, grows, stops
// being atomic or is renamed on either side, or in the document, fails.

// specField is one row of an offset table of docs/SHM.md.
type specField struct {
	area   string // "group", "proc", "mailbox", "out" or "lane"
	name   string // as the document spells it, e.g. "done_no", "status" (of status[2])
	off    int
	size   int // of the whole field
	elems  int // array elements (status[2]: 2), 1 otherwise
	atomic bool
}

// spec is what the test reads from docs/SHM.md.
type spec struct {
	version       int
	pageSize      int
	groupMagic    uint64
	procMagic     uint64
	laneMagic     uint64
	laneBuffer    int // offset of a lane's buffer
	fields        []specField
	mailbox       int // offset of mailbox 0 in page 0
	outCall       int // offset of the out-call lines in page 0
	outNames      int // room for the names in the out buffer
	mailboxStride int // and of mailbox i+1 from mailbox i
	maxMailboxes  int
	entryTable    int
	maxEntries    int
	maxName       int
	buffers       int
	statuses      map[string]int // name -> value
	claimStates   map[string]int
	processStates map[string]int
}

var (
	specRow      = regexp.MustCompile("^\\| (0x[0-9A-Fa-f]+) \\| ([0-9]+(?: x [0-9]+)?) \\| ([a-z_]+)(\\[[0-9]+\\])?( \\(atomic\\))? \\|(.*)$")
	specHex      = regexp.MustCompile(`0x[0-9A-Fa-f]+`)
	specNumbered = regexp.MustCompile(`(\d) ([a-z][a-z ]*?)(?: by [a-zA-Z ]+)?(?: \(|,|$|\.)`)
)

func parseSpec(t *testing.T) spec {
	t.Helper()
	b, err := os.ReadFile(repoFile("docs", "SHM.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	s := spec{statuses: map[string]int{}, claimStates: map[string]int{}, processStates: map[string]int{}}
	num := func(what, v string) int {
		n, err := strconv.ParseInt(v, 0, 64)
		if err != nil {
			t.Fatalf("docs/SHM.md: %s: %q is not a number", what, v)
		}
		return int(n)
	}
	find := func(what, pattern string) []string {
		m := regexp.MustCompile(pattern).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("docs/SHM.md no longer says %s (pattern %q)", what, pattern)
		}
		return m
	}
	s.version = num("the version", find("the layout version", `^# .*\(layout version (\d+)\)`)[1])
	s.pageSize = num("the page size", find("the group page's size", `(?m)^## The group page \((\d+) bytes`)[1])
	m := find("the mailboxes' offsets", `(?m)^### Page 0, lines 2 to K\+1 \((0x[0-9A-Fa-f]+) \+ i \* (0x[0-9A-Fa-f]+)\): mailbox i`)
	s.mailbox, s.mailboxStride = num("mailbox 0", m[1]), num("mailbox stride", m[2])
	s.maxMailboxes = num("mailboxes", find("the most mailboxes", `\| mailboxes \| K, the number of mailboxes \(1 to (\d+)\)`)[1])
	s.outCall = num("the out-call lines", find("the out-call lines' offset", `(?m)^### Page 0, lines 62 and 63 \((0x[0-9A-Fa-f]+)\): the process's own call`)[1])
	s.outNames = num("the out buffer's room for names", find("the out buffer's size", `max_message \+ (\d+) bytes rounded up to a multiple of 4096`)[1])
	s.entryTable = num("page 1", find("the entry table's offset", `(?m)^### Page 1 \((0x[0-9A-Fa-f]+)\)`)[1])
	m = find("the entry table's size", `Up to (\d+) entry names of (\d+) bytes each`)
	s.maxEntries, s.maxName = num("entries", m[1]), num("name", m[2])
	s.laneBuffer = num("a lane's buffer", find("a lane's buffer's offset", "(?m)^The buffer, at (0x[0-9A-Fa-f]+), `stride` bytes")[1])
	s.buffers = num("buffers", find("the buffers' offset", `(?m)^### The buffers \(mailbox i's at (0x[0-9A-Fa-f]+) \+ i \* stride\)`)[1])
	numbered := func(into map[string]int, what, line string) {
		for _, m := range specNumbered.FindAllStringSubmatch(line, -1) {
			into[strings.TrimSpace(m[2])] = num(what, m[1])
		}
		if len(into) < 3 {
			t.Fatalf("docs/SHM.md: %s: only %v in %q", what, into, line)
		}
	}
	statusText := find("the statuses", `(?s)Statuses: (.*?)\n\n`)[1]
	statusText = regexp.MustCompile(`\([^)]*\)`).ReplaceAllString(strings.ReplaceAll(statusText, "\n", " "), "")
	numbered(s.statuses, "statuses", statusText)

	area := ""
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "## The group page"):
			area = "group"
		case strings.HasPrefix(line, "### Page 0, line 0"), strings.HasPrefix(line, "### Page 0, line 1 "):
			area = "proc"
		case strings.HasPrefix(line, "### Page 0, lines 2 to K+1"):
			area = "mailbox"
		case strings.HasPrefix(line, "### Page 0, lines 62 and 63"):
			area = "out"
		case strings.HasPrefix(line, "### The lane's page 0"):
			area = "lane"
		case strings.HasPrefix(line, "#"):
			area = ""
		}
		r := specRow.FindStringSubmatch(line)
		if r == nil || area == "" {
			continue
		}
		f := specField{area: area, name: r[3], off: num(r[3], r[1]), elems: 1, atomic: r[5] != ""}
		if sz, n, ok := strings.Cut(r[2], " x "); ok {
			f.elems = num(r[3], n)
			f.size = num(r[3], sz) * f.elems
		} else {
			f.size = num(r[3], r[2])
		}
		if r[4] != "" && num(r[3], strings.Trim(r[4], "[]")) != f.elems {
			t.Fatalf("docs/SHM.md: %s: %s elements, size says %d", r[3], r[4], f.elems)
		}
		rest := r[6]
		switch area + "." + f.name {
		case "group.magic":
			s.groupMagic = uint64(num("group magic", specHex.FindString(rest)))
		case "proc.magic":
			s.procMagic = uint64(num("process magic", specHex.FindString(rest)))
		case "lane.magic":
			s.laneMagic = uint64(num("lane magic", specHex.FindString(rest)))
		case "group.version", "proc.version":
			if v := num("version", strings.Trim(rest, " |")); v != s.version {
				t.Errorf("docs/SHM.md: the %s page's version is %d, the title says %d", area, v, s.version)
			}
		case "mailbox.claim":
			_, states, _ := strings.Cut(rest, ":")
			numbered(s.claimStates, "claim states", strings.Trim(states, " |"))
		case "proc.state":
			numbered(s.processStates, "process states", regexp.MustCompile(`\([^)]*\)`).ReplaceAllString(strings.Trim(rest, " |"), ""))
		}
		s.fields = append(s.fields, f)
	}
	if len(s.fields) != 55 {
		t.Fatalf("docs/SHM.md: %d fields in the offset tables, want the 55 this test knows (add a new one to both sides and here)", len(s.fields))
	}
	return s
}

// goField is the Go struct field of a field of the document: its name in
// camel case, but for the one the Go side names differently.
func goField(f specField) string {
	if f.area == "group" && f.name == "reader_sleeping" {
		return "sleeping"
	}
	parts := strings.Split(f.name, "_")
	for i := 1; i < len(parts); i++ {
		parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
	}
	return strings.Join(parts, "")
}

// TestSpecGo holds the Go side to docs/SHM.md.
func TestSpecGo(t *testing.T) {
	s := parseSpec(t)
	if s.version != Version || s.pageSize != pageSize || s.groupMagic != groupMagic || s.procMagic != procMagic {
		t.Errorf("docs/SHM.md says version %d, page %d, magics %#x %#x; layout.go has %d, %d, %#x %#x",
			s.version, s.pageSize, s.groupMagic, s.procMagic, Version, pageSize, uint64(groupMagic), uint64(procMagic))
	}
	if s.laneMagic != laneMagicValue || s.laneBuffer != lBuffer {
		t.Errorf("docs/SHM.md says a lane's magic is %#x and its buffer at %#x; lane.go %#x and %#x", s.laneMagic, s.laneBuffer, uint64(laneMagicValue), lBuffer)
	}
	if s.outCall != pOut || s.outNames != outNames {
		t.Errorf("docs/SHM.md puts the out-call lines at %#x and %d bytes for names in the out buffer; layout.go %#x and %d", s.outCall, s.outNames, pOut, outNames)
	}
	if f, ok := reflect.TypeFor[procCtl]().FieldByName("out"); !ok || int(f.Offset) != s.outCall {
		t.Errorf("Go: the out-call lines are not at %#x", s.outCall)
	}
	if s.mailbox != pMailbox || s.mailboxStride != mailboxSize || s.maxMailboxes != MaxMailboxes ||
		s.entryTable != pEntryTable || s.buffers != pBuffer || s.maxEntries != maxEntries || s.maxName != maxName {
		t.Errorf("docs/SHM.md says %d mailboxes at %#x + i * %#x, entry table at %#x (%d names of %d bytes), buffers at %#x; layout.go: %d at %#x + i * %#x, %#x (%d of %d), %#x",
			s.maxMailboxes, s.mailbox, s.mailboxStride, s.entryTable, s.maxEntries, s.maxName, s.buffers,
			MaxMailboxes, pMailbox, mailboxSize, pEntryTable, maxEntries, maxName, pBuffer)
	}
	types := map[string]reflect.Type{
		"group": reflect.TypeFor[groupPage](), "proc": reflect.TypeFor[procCtl](), "mailbox": reflect.TypeFor[mailbox](),
		"out": reflect.TypeFor[outCall](), "lane": reflect.TypeFor[laneHdr](),
	}
	for _, f := range s.fields {
		sf, ok := types[f.area].FieldByName(goField(f))
		if !ok {
			t.Errorf("%s %s: no field %s in the Go struct %s", f.area, f.name, goField(f), types[f.area])
			continue
		}
		ft := sf.Type
		if ft.Kind() == reflect.Array {
			ft = ft.Elem()
		}
		atomic := ft.PkgPath() == "sync/atomic"
		if int(sf.Offset) != f.off || int(sf.Type.Size()) != f.size || atomic != f.atomic {
			t.Errorf("%s %s: Go has offset %#x, %d bytes, atomic %v; docs/SHM.md says %#x, %d, %v",
				f.area, f.name, sf.Offset, sf.Type.Size(), atomic, f.off, f.size, f.atomic)
		}
	}
	if f := reflect.TypeFor[procCtl]().Field(indexOf(t, reflect.TypeFor[procCtl](), "mb")); int(f.Offset) != s.mailbox ||
		f.Type.Len() != s.maxMailboxes || int(f.Type.Elem().Size()) != s.mailboxStride {
		t.Errorf("Go: %d mailboxes of %d bytes at %#x; docs/SHM.md: %d of %d at %#x",
			f.Type.Len(), f.Type.Elem().Size(), f.Offset, s.maxMailboxes, s.mailboxStride, s.mailbox)
	}
	for name, v := range s.statuses {
		if Status(v).String() != name {
			t.Errorf("status %d: docs/SHM.md says %q, Go %q", v, name, Status(v))
		}
	}
	if len(s.statuses) != int(statusEnd) {
		t.Errorf("docs/SHM.md names %d statuses, Go has %d", len(s.statuses), statusEnd)
	}
	goClaims := map[string]int{"offered": claimOffered, "taken": claimTaken, "revoked": claimRevoked}
	goStates := map[string]int{"new": stateNew, "ready": stateReady, "left": stateLeft}
	for what, pair := range map[string][2]map[string]int{"claim state": {s.claimStates, goClaims}, "process state": {s.processStates, goStates}} {
		if !reflect.DeepEqual(pair[0], pair[1]) {
			t.Errorf("%ss: docs/SHM.md %v, Go %v", what, pair[0], pair[1])
		}
	}
}

func indexOf(t *testing.T, typ reflect.Type, name string) int {
	sf, ok := typ.FieldByName(name)
	if !ok {
		t.Fatalf("no field %s in %s", name, typ)
	}
	return sf.Index[0]
}

// cSpecProgram is the C side of the spec test: every number of docs/SHM.md
// as a compile-time assertion on uap-c/tpsched_uap.h, and the statuses'
// names checked when it runs.
func cSpecProgram(s spec) string {
	var b strings.Builder
	b.WriteString("/* Generated by shm/spec_test.go from docs/SHM.md. */\n")
	b.WriteString("#include <stddef.h>\n#include <stdio.h>\n#include <string.h>\n#include \"tpsched_uap.h\"\n\n")
	assert := func(cond, msg string, args ...any) {
		fmt.Fprintf(&b, "_Static_assert(%s, %q);\n", cond, fmt.Sprintf(msg, args...))
	}
	structs := map[string]string{"group": "struct tpsched_group_page", "proc": "struct tpsched_proc_ctl", "mailbox": "struct tpsched_mailbox", "out": "struct tpsched_out_call", "lane": "struct tpsched_lane"}
	assert(fmt.Sprintf("TPSCHED_LAYOUT_VERSION == %d", s.version), "layout version %d", s.version)
	assert(fmt.Sprintf("TPSCHED_PAGE_SIZE == %d", s.pageSize), "page size %d", s.pageSize)
	assert(fmt.Sprintf("TPSCHED_GROUP_MAGIC == UINT64_C(%#x)", s.groupMagic), "group magic %#x", s.groupMagic)
	assert(fmt.Sprintf("TPSCHED_PROC_MAGIC == UINT64_C(%#x)", s.procMagic), "process magic %#x", s.procMagic)
	assert(fmt.Sprintf("TPSCHED_LANE_MAGIC == UINT64_C(%#x)", s.laneMagic), "lane magic %#x", s.laneMagic)
	assert(fmt.Sprintf("TPSCHED_LANE_BUFFER == %#x && sizeof(struct tpsched_lane) <= %#x", s.laneBuffer, s.laneBuffer), "a lane's buffer at %#x", s.laneBuffer)
	assert(fmt.Sprintf("offsetof(struct tpsched_proc_ctl, mailbox[0]) == %#x", s.mailbox), "mailbox 0 at %#x", s.mailbox)
	assert(fmt.Sprintf("offsetof(struct tpsched_proc_ctl, mailbox[1]) == %#x", s.mailbox+s.mailboxStride), "mailbox 1 at %#x", s.mailbox+s.mailboxStride)
	assert(fmt.Sprintf("offsetof(struct tpsched_proc_ctl, out) == %#x && TPSCHED_OUT_CALL == %#x", s.outCall, s.outCall), "out-call lines at %#x", s.outCall)
	assert(fmt.Sprintf("TPSCHED_OUT_NAMES == %d", s.outNames), "%d bytes for names in the out buffer", s.outNames)
	assert(fmt.Sprintf("TPSCHED_MAX_MAILBOXES == %d", s.maxMailboxes), "%d mailboxes at most", s.maxMailboxes)
	assert(fmt.Sprintf("TPSCHED_ENTRY_TABLE == %#x", s.entryTable), "entry table at %#x", s.entryTable)
	assert(fmt.Sprintf("TPSCHED_MAX_ENTRIES == %d && TPSCHED_MAX_NAME == %d", s.maxEntries, s.maxName), "%d entry names of %d bytes", s.maxEntries, s.maxName)
	assert(fmt.Sprintf("TPSCHED_BUFFERS == %#x", s.buffers), "buffers at %#x", s.buffers)
	assert(fmt.Sprintf("sizeof(struct tpsched_group_page) <= %d && sizeof(struct tpsched_proc_ctl) <= %d", s.pageSize, s.pageSize), "page 0 and the group page fit a page")
	for _, f := range s.fields {
		st := structs[f.area]
		member := fmt.Sprintf("((%s *)0)->%s", st, f.name)
		elem := member
		if f.elems > 1 || f.name == "entry" {
			elem += "[0]"
		}
		assert(fmt.Sprintf("offsetof(%s, %s) == %#x", st, f.name, f.off), "%s %s at offset %#x", f.area, f.name, f.off)
		assert(fmt.Sprintf("sizeof(%s) == %d", member, f.size), "%s %s of %d bytes", f.area, f.name, f.size)
		isAtomic := fmt.Sprintf("_Generic(&%s, _Atomic uint32_t *: 1, _Atomic uint64_t *: 1, _Atomic int64_t *: 1, default: 0)", elem)
		if f.atomic {
			assert(isAtomic+" == 1", "%s %s is atomic", f.area, f.name)
		} else {
			assert(isAtomic+" == 0", "%s %s is plain memory", f.area, f.name)
		}
	}
	cNames := map[string]string{"ok": "TPSCHED_OK", "application error": "TPSCHED_APP_ERROR", "no such service": "TPSCHED_NO_SUCH_SERVICE", "timed out": "TPSCHED_TIMED_OUT",
		"offered": "TPSCHED_CLAIM_OFFERED", "taken": "TPSCHED_CLAIM_TAKEN", "revoked": "TPSCHED_CLAIM_REVOKED",
		"new": "TPSCHED_STATE_NEW", "ready": "TPSCHED_STATE_READY", "left": "TPSCHED_STATE_LEFT"}
	for _, m := range []map[string]int{s.statuses, s.claimStates, s.processStates} {
		for name, v := range m {
			c, ok := cNames[name]
			if !ok {
				c = "TPSCHED_UNKNOWN_NAME_IN_SHM_MD /* " + name + " */"
			}
			assert(fmt.Sprintf("%s == %d", c, v), "%s is %d", name, v)
		}
	}
	b.WriteString("\nint main(void)\n{\n\tint bad = 0;\n")
	for name, v := range s.statuses {
		fmt.Fprintf(&b, "\tif (strcmp(tpsched_status_name(%d), %q) != 0) {\n\t\tprintf(\"status %d is named %%s, docs/SHM.md says %s\\n\", tpsched_status_name(%d));\n\t\tbad = 1;\n\t}\n",
			v, name, v, name, v)
	}
	for _, m := range []int{1, s.pageSize, s.pageSize + 1} {
		for _, k := range []int{1, 8, s.maxMailboxes} {
			round := func(n int) int { return (n + s.pageSize - 1) / s.pageSize * s.pageSize }
			want := s.buffers + k*round(m) + round(m+s.outNames)
			fmt.Fprintf(&b, "\tif (TPSCHED_AREA_SIZE(%d, %d) != %d) {\n\t\tprintf(\"area for max_message %d, %d mailboxes: %%llu bytes, want %d\\n\", (unsigned long long)TPSCHED_AREA_SIZE(%d, %d));\n\t\tbad = 1;\n\t}\n",
				m, k, want, m, k, want, m, k)
		}
	}
	b.WriteString("\tif (!bad)\n\t\tprintf(\"ok\\n\");\n\treturn bad;\n}\n")
	return b.String()
}

// TestSpecC holds the C header to docs/SHM.md: the generated program must
// compile (its assertions hold) and run clean.
func TestSpecC(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skipf("the C side of the spec test needs gcc: %v", err)
	}
	s := parseSpec(t)
	root, err := filepath.Abs(repoFile())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "spec.c")
	if err := os.WriteFile(src, []byte(cSpecProgram(s)), 0o644); err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(dir, "spec")
	args := append(append([]string{}, cFlags...), "-I", filepath.Join(root, "uap-c"), "-o", prog, src, filepath.Join(root, "uap-c/tpsched_uap.c"))
	if err := gcc(dir, args...); err != nil {
		t.Fatalf("the C header does not keep docs/SHM.md: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, prog).CombinedOutput()
	if err != nil || string(out) != "ok\n" {
		t.Fatalf("spec program: %v\n%s", err, out)
	}
}
