package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"time"

	"golang.org/x/net/websocket"
)

// shootPage opens pageURL in headless Chromium, lets it run for wait in
// real time, and writes a PNG of it to out. chromium --screenshot cannot
// do this: it captures at once, or after a virtual time budget in which
// the page's timers run without real time passing, so the status page's
// rates (differences between two fetches of /status) would be empty. This
// drives Chromium over its DevTools protocol instead.
func shootPage(ctx context.Context, pageURL, out string, wait time.Duration, width, height int) error {
	dir, err := os.MkdirTemp("", "tpdashboard-chromium-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, "chromium", "--headless", "--no-sandbox", "--disable-gpu",
		"--disable-background-networking", "--disable-dev-shm-usage", "--no-first-run", "--hide-scrollbars",
		"--user-data-dir="+dir, fmt.Sprintf("--window-size=%d,%d", width, height),
		"--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "--remote-allow-origins=http://127.0.0.1",
		"about:blank")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("chromium: %w", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	listening := regexp.MustCompile(`DevTools listening on ws://([^/]+)/`)
	var host string
	sc := bufio.NewScanner(stderr)
	for host == "" && sc.Scan() {
		if m := listening.FindStringSubmatch(sc.Text()); m != nil {
			host = m[1]
		}
	}
	if host == "" {
		return fmt.Errorf("chromium did not say where DevTools listen")
	}
	go func() {
		for sc.Scan() {
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+host+"/json/new?"+url.QueryEscape(pageURL), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("devtools: %w", err)
	}
	var target struct {
		WebSocketDebuggerURL string `json:"webSocketDebuggerUrl"`
	}
	err = json.NewDecoder(resp.Body).Decode(&target)
	resp.Body.Close()
	if err != nil || target.WebSocketDebuggerURL == "" {
		return fmt.Errorf("devtools: new page: %s: %v", resp.Status, err)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(wait):
	}
	ws, err := websocket.Dial(target.WebSocketDebuggerURL, "", "http://127.0.0.1")
	if err != nil {
		return fmt.Errorf("devtools: %w", err)
	}
	defer ws.Close()
	if err := websocket.JSON.Send(ws, map[string]any{"id": 1, "method": "Page.captureScreenshot",
		"params": map[string]any{"format": "png"}}); err != nil {
		return err
	}
	_ = ws.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		var msg struct {
			ID     int `json:"id"`
			Result struct {
				Data string `json:"data"`
			} `json:"result"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := websocket.JSON.Receive(ws, &msg); err != nil {
			return fmt.Errorf("devtools: %w", err)
		}
		if msg.ID != 1 {
			continue // an event
		}
		if msg.Error != nil {
			return fmt.Errorf("devtools: %s", msg.Error.Message)
		}
		png, err := base64.StdEncoding.DecodeString(msg.Result.Data)
		if err != nil {
			return err
		}
		return os.WriteFile(out, png, 0o644)
	}
}
