// Command logcheck checks a decision log's proofs the way a reviewer would, with
// standard Go packages nobody at sessionstate wrote: golang.org/x/mod/sumdb/note
// opens the signed checkpoint, github.com/transparency-dev/formats/log parses it,
// and github.com/transparency-dev/merkle verifies RFC 6962 inclusion and
// consistency proofs against its root.
//
//	logcheck checkpoint --vkey VKEY --origin ORIGIN NOTE_FILE
//	logcheck inclusion --vkey VKEY --origin ORIGIN --checkpoint NOTE_FILE --proof PROOF_JSON --leaf LEAF_FILE
//	logcheck consistency --vkey VKEY --origin ORIGIN --old NOTE_FILE --new NOTE_FILE --proof PROOF_JSON
//
// It prints "ok ..." and exits 0 when everything holds, and exits 1 otherwise.
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/transparency-dev/formats/log"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/note"
)

// inclusionProof is the JSON of GET /v1/decisions/{decision_id}/inclusion.
// []byte fields are standard base64 in JSON, as the service writes them.
type inclusionProof struct {
	LeafIndex uint64   `json:"leaf_index"`
	TreeSize  uint64   `json:"tree_size"`
	LeafHash  []byte   `json:"leaf_hash"`
	Hashes    [][]byte `json:"hashes"`
}

// consistencyProof is the JSON of GET /v1/decisions/consistency.
type consistencyProof struct {
	First  uint64   `json:"first"`
	Second uint64   `json:"second"`
	Hashes [][]byte `json:"hashes"`
}

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: logcheck checkpoint|inclusion|consistency [flags]"))
	}
	commands := map[string]func([]string) (string, error){
		"checkpoint":  checkCheckpoint,
		"inclusion":   checkInclusion,
		"consistency": checkConsistency,
	}
	command, ok := commands[os.Args[1]]
	if !ok {
		fail(errors.New("unknown command; want checkpoint, inclusion or consistency"))
	}
	result, err := command(os.Args[2:])
	if err != nil {
		fail(err)
	}
	fmt.Println("ok " + result)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "logcheck:", err)
	os.Exit(1)
}

// logFlags are the flags every command takes: which log, and its key.
type logFlags struct {
	set    *flag.FlagSet
	vkey   *string
	origin *string
}

func newLogFlags(name string) logFlags {
	set := flag.NewFlagSet(name, flag.ContinueOnError)
	return logFlags{
		set:    set,
		vkey:   set.String("vkey", "", "the log's note verifier key"),
		origin: set.String("origin", "", "the log's origin line"),
	}
}

// parse parses args, which must set every flag and name positional files.
func (f logFlags) parse(args []string, positional int) error {
	if err := f.set.Parse(args); err != nil {
		return err
	}
	var missing error
	f.set.VisitAll(func(fl *flag.Flag) {
		if fl.Value.String() == "" {
			missing = fmt.Errorf("%s: --%s is required", f.set.Name(), fl.Name)
		}
	})
	if missing == nil && f.set.NArg() != positional {
		missing = fmt.Errorf("%s: want %d file argument(s) after the flags", f.set.Name(), positional)
	}
	return missing
}

// open reads a checkpoint note, checks the log's signature on it and parses it.
func (f logFlags) open(path string) (*log.Checkpoint, error) {
	verifier, err := note.NewVerifier(*f.vkey)
	if err != nil {
		return nil, fmt.Errorf("verifier key: %v", err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	cp, _, _, err := log.ParseCheckpoint(raw, *f.origin, verifier)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %v", path, err)
	}
	return cp, nil
}

func readJSON(path string, v any) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("proof %s: %v", path, err)
	}
	return nil
}

func checkCheckpoint(args []string) (string, error) {
	f := newLogFlags("checkpoint")
	if err := f.parse(args, 1); err != nil {
		return "", err
	}
	cp, err := f.open(f.set.Arg(0))
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("checkpoint %s size %d root %s",
		cp.Origin, cp.Size, base64.StdEncoding.EncodeToString(cp.Hash)), nil
}

func checkInclusion(args []string) (string, error) {
	f := newLogFlags("inclusion")
	checkpoint := f.set.String("checkpoint", "", "the checkpoint note file")
	proofFile := f.set.String("proof", "", "the inclusion proof JSON file")
	leafFile := f.set.String("leaf", "", "the file holding the leaf's bytes")
	if err := f.parse(args, 0); err != nil {
		return "", err
	}
	cp, err := f.open(*checkpoint)
	if err != nil {
		return "", err
	}
	var p inclusionProof
	if err := readJSON(*proofFile, &p); err != nil {
		return "", err
	}
	leaf, err := os.ReadFile(*leafFile)
	if err != nil {
		return "", err
	}
	if p.TreeSize != cp.Size {
		return "", fmt.Errorf("the proof is for tree size %d, the checkpoint's is %d", p.TreeSize, cp.Size)
	}
	if !bytes.Equal(rfc6962.DefaultHasher.HashLeaf(leaf), p.LeafHash) {
		return "", errors.New("the leaf's RFC 6962 hash is not the proof's leaf_hash")
	}
	if err := proof.VerifyInclusion(rfc6962.DefaultHasher, p.LeafIndex, p.TreeSize, p.LeafHash, p.Hashes, cp.Hash); err != nil {
		return "", fmt.Errorf("inclusion proof: %v", err)
	}
	return fmt.Sprintf("inclusion leaf %d in tree size %d", p.LeafIndex, p.TreeSize), nil
}

func checkConsistency(args []string) (string, error) {
	f := newLogFlags("consistency")
	oldFile := f.set.String("old", "", "the older checkpoint note file")
	newFile := f.set.String("new", "", "the newer checkpoint note file")
	proofFile := f.set.String("proof", "", "the consistency proof JSON file")
	if err := f.parse(args, 0); err != nil {
		return "", err
	}
	older, err := f.open(*oldFile)
	if err != nil {
		return "", err
	}
	newer, err := f.open(*newFile)
	if err != nil {
		return "", err
	}
	var p consistencyProof
	if err := readJSON(*proofFile, &p); err != nil {
		return "", err
	}
	if p.First != older.Size || p.Second != newer.Size {
		return "", fmt.Errorf("the proof is from size %d to %d, the checkpoints are %d and %d",
			p.First, p.Second, older.Size, newer.Size)
	}
	if err := proof.VerifyConsistency(rfc6962.DefaultHasher, p.First, p.Second, p.Hashes, older.Hash, newer.Hash); err != nil {
		return "", fmt.Errorf("consistency proof: %v", err)
	}
	return fmt.Sprintf("consistency from size %d to %d", p.First, p.Second), nil
}
