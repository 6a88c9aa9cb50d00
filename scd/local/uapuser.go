package local

import (
	"hash/fnv"
	"os"

	"tpsched/scd/def"
)

// uapUIDBase starts the range of user and group ids a root daemon gives
// the UAPs of servers whose definitions name none: each server its own id,
// so that the processes of one group can neither read nor signal another
// group's (nor open their shared memory through /proc/PID/fd), and none
// runs as root. Ids in the range have no passwd entry; a real application
// names its user in the definition (uid, gid).
//
// The id is derived from the node's id and the server's name, so that
// servers of the same name on two nodes of one host (a test cluster on
// 127.0.0.x) do not share a user either. The processes of one server share
// its uid but not its gid: the process in slot i runs with gid id+i
// (procmgr.Spec.SlotGIDs). Access to another process's /proc/PID/fd, mem
// and environ needs the same uid and the same gid, so no process can open
// a sibling's area, not even in the moment between the sibling's exec and
// its attach, before it makes itself non-dumpable.
const (
	uapUIDBase  = 1_900_000_000
	uapUIDRange = 1_000_000
)

// uapCredentials is the uid and gid the processes of s run as: those its
// definition names (a uid without gid: def.Load gave it the user's primary
// group); otherwise -1, the daemon's own, when the daemon is not root;
// otherwise an id of their own derived from the node's id and the server's
// name, stable across restarts and distinct from the other servers of this
// node, with a gid per process (slotGIDs: slot i runs with gid+i) unless
// the definition names the gid. A root daemon never runs a UAP as root
// unless a definition says so (uid = 0, or group root, with sysconf
// uap_allow_root = Y).
func (sc *Scheduler) uapCredentials(s *def.Server) (uid, gid int, slotGIDs bool) {
	uid, gid = s.UID, s.GID
	if uid >= 0 || os.Geteuid() != 0 {
		return uid, gid, false
	}
	if sc.uapIDs == nil {
		sc.uapIDs = derivedUAPIDs(sc.cfg.System.NodeID, sc.cfg.Servers)
	}
	id := sc.uapIDs[s.Name]
	if gid < 0 {
		return id, id, true
	}
	return id, gid, false
}

// derivedUAPIDs gives every server an id in the range: a hash of the node
// id and its name, moved on past ids taken by servers before it in name
// order.
func derivedUAPIDs(nodeID string, servers []def.Server) map[string]int {
	ids := make(map[string]int, len(servers))
	taken := make(map[int]bool, len(servers))
	for _, s := range servers { // sorted by name (def.Load)
		h := fnv.New32a()
		h.Write([]byte(nodeID))
		h.Write([]byte{0})
		h.Write([]byte(s.Name))
		off := int(h.Sum32() % uapUIDRange)
		for taken[off] {
			off = (off + 1) % uapUIDRange
		}
		taken[off] = true
		ids[s.Name] = uapUIDBase + off
	}
	return ids
}
