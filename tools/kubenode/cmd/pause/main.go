// Command pause is the pod sandbox's process: it sleeps until SIGINT/SIGTERM and reaps the children it
// inherits as PID 1 of the pod's PID namespace. The project builds its own (static, no C toolchain) instead of
// pulling registry.k8s.io/pause, which no test machine can reach.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
