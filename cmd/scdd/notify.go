package main

import (
	"log/slog"
	"net"
	"os"
	"strings"
)

// sdNotify sends state to systemd when it runs scdd as a Type=notify
// service ($NOTIFY_SOCKET); elsewhere it does nothing. After a restart the
// new process sends READY=1 with its MAINPID, so systemd follows it (the
// unit needs NotifyAccess=all for a process that is not yet the main one).
func sdNotify(log *slog.Logger, state string) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return
	}
	if strings.HasPrefix(path, "@") {
		path = "\x00" + path[1:] // an abstract socket
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err == nil {
		_, err = c.Write([]byte(state))
		c.Close()
	}
	if err != nil {
		log.Warn("telling systemd", "state", state, "err", err)
	}
}
