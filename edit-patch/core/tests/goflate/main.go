// goflate-ref: the reference for edit-patch/core/src/goflate.rs (its tests
// build and run this program).
//
//	goflate-ref deflate LEVEL CHUNK < in > out
//	    raw DEFLATE of stdin by compress/flate NewWriter(w, LEVEL), written
//	    in Write calls of CHUNK bytes (0 = one Write), then Close.
//	goflate-ref bench LEVEL RUNS < in
//	    deflates stdin RUNS times with one Write each and prints the best
//	    time in nanoseconds (for the speed comparison).
//	goflate-ref zip OUT.zip FILE...
//	    a ZIP by archive/zip's default compressor (zip.Writer.Create, i.e.
//	    method Deflate, the pooled flate writer), each FILE copied with
//	    io.Copy; member i is named "<i>-<base name>".
package main

import (
	"archive/zip"
	"bufio"
	"compress/flate"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "goflate-ref:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 3 && args[0] == "deflate" {
		level, err := strconv.Atoi(args[1])
		if err != nil {
			return err
		}
		chunk, err := strconv.Atoi(args[2])
		if err != nil {
			return err
		}
		data, err := io.ReadAll(os.Stdin)
		if err != nil {
			return err
		}
		out := bufio.NewWriter(os.Stdout)
		w, err := flate.NewWriter(out, level)
		if err != nil {
			return err
		}
		if chunk <= 0 {
			chunk = len(data) + 1
		}
		for len(data) > 0 {
			n := chunk
			if n > len(data) {
				n = len(data)
			}
			if _, err := w.Write(data[:n]); err != nil {
				return err
			}
			data = data[n:]
		}
		if err := w.Close(); err != nil {
			return err
		}
		return out.Flush()
	}
	if len(args) == 3 && args[0] == "bench" {
		level, err := strconv.Atoi(args[1])
		if err != nil {
			return err
		}
		runs, err := strconv.Atoi(args[2])
		if err != nil {
			return err
		}
		data, err := io.ReadAll(os.Stdin)
		if err != nil {
			return err
		}
		best := time.Duration(1 << 62)
		for i := 0; i < runs; i++ {
			start := time.Now()
			w, err := flate.NewWriter(io.Discard, level)
			if err != nil {
				return err
			}
			w.Write(data)
			w.Close()
			if d := time.Since(start); d < best {
				best = d
			}
		}
		fmt.Println(best.Nanoseconds())
		return nil
	}
	if len(args) >= 2 && args[0] == "zip" {
		f, err := os.Create(args[1])
		if err != nil {
			return err
		}
		zw := zip.NewWriter(f)
		for i, name := range args[2:] {
			in, err := os.Open(name)
			if err != nil {
				return err
			}
			w, err := zw.Create(fmt.Sprintf("%d-%s", i, filepath.Base(name)))
			if err != nil {
				return err
			}
			if _, err := io.Copy(w, in); err != nil {
				return err
			}
			in.Close()
		}
		if err := zw.Close(); err != nil {
			return err
		}
		return f.Close()
	}
	return fmt.Errorf("usage: goflate-ref deflate LEVEL CHUNK | zip OUT.zip FILE...")
}
