// rezip-go: write a ZIP with Go's archive/zip (its default deflater, level 5)
// from an unpacked document, keeping member order, names, times and which
// members are stored. Used by experiments/bench/byte_goals.py.
//
//	go run . LIST DIR OUT.zip
//
// LIST has one member a line: "method<TAB>unix-mtime<TAB>name" (method 0 =
// stored, 8 = deflated; a name ending in "/" is a directory); the member's
// bytes are DIR/name.
package main

import (
	"archive/zip"
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: rezip-go LIST DIR OUT.zip")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], os.Args[3]); err != nil {
		fmt.Fprintln(os.Stderr, "rezip-go:", err)
		os.Exit(1)
	}
}

func run(list, dir, out string) error {
	in, err := os.Open(list)
	if err != nil {
		return err
	}
	defer in.Close()
	file, err := os.Create(out)
	if err != nil {
		return err
	}
	defer file.Close()
	writer := zip.NewWriter(file)
	scanner := bufio.NewScanner(in)
	for scanner.Scan() {
		fields := strings.SplitN(scanner.Text(), "\t", 3)
		if len(fields) != 3 {
			return fmt.Errorf("bad line %q", scanner.Text())
		}
		method, err := strconv.Atoi(fields[0])
		if err != nil {
			return err
		}
		mtime, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil {
			return err
		}
		name := fields[2]
		header := &zip.FileHeader{Name: name, Method: uint16(method),
			Modified: time.Unix(mtime, 0).UTC()}
		w, err := writer.CreateHeader(header)
		if err != nil {
			return err
		}
		if strings.HasSuffix(name, "/") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil {
			return err
		}
		if _, err := w.Write(data); err != nil {
			return err
		}
	}
	if err := scanner.Err(); err != nil {
		return err
	}
	if err := writer.Close(); err != nil {
		return err
	}
	return file.Close()
}
