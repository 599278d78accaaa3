// Command counter is the stateful test workload: it logs one "started" line when its process starts, then
// "count N" every -interval, N held only in memory. After a CRIU restore it keeps counting from where it was and
// prints no new "started" line, so a restore is told from a restart by its log alone. HOLD_MIB (or -hold-mib)
// makes it hold that much touched memory, for moves of a given size.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"
)

func main() {
	interval := flag.Duration("interval", 200*time.Millisecond, "time between counts")
	holdMiB := flag.Int("hold-mib", 0, "MiB of memory to hold (default: $HOLD_MIB, else 0)")
	flag.Parse()
	if *holdMiB == 0 {
		*holdMiB, _ = strconv.Atoi(os.Getenv("HOLD_MIB"))
	}
	held := make([]byte, *holdMiB<<20)
	for i := 0; i < len(held); i += 4096 {
		held[i] = byte(i >> 12) // touch every page so it is resident and checkpointed
	}
	host, _ := os.Hostname()
	fmt.Printf("started pid=%d host=%s hold_mib=%d at=%s\n", os.Getpid(), host, *holdMiB,
		time.Now().UTC().Format(time.RFC3339Nano))
	for n := 0; ; n++ {
		fmt.Printf("count %d\n", n)
		time.Sleep(*interval)
		runtime.KeepAlive(held)
	}
}
