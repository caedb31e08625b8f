package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/taskrun/taskrun/attest"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/termsafe"
)

const verifyHelp = `
Verifies a run's attestation (docs/attestation.md): the DSSE envelope the run
stored as ` + attest.ObjectName + `, or the envelope in FILE. It checks the
signature with --key, that the statement is about the run, and re-hashes every
subject from --store. Each mismatch is named: a changed or missing object, an
object the statement does not cover, a changed statement or predicate, another
key, an unsigned envelope, or an envelope moved from another run.

Exit status: 0 when everything verifies, 1 when anything does not, 2 for a bad
argument or key, 125 when the store cannot be read.
` + runLookupHelp

func init() {
	register(&command{
		Name:     "verify",
		Synopsis: "verify a run's signed attestation against the store",
		Args:     "RUN|FILE",
		Help:     verifyHelp,
		Flags: func(fs *pflag.FlagSet) action {
			var f storedRunFlags
			f.define(fs)
			key := fs.String("key", "", "PEM public key of the host that signed the attestation (required; openssl pkey -pubout -in PRIVATE_KEY)")
			jsonOut := fs.Bool("json", false, "print the verdict as JSON")
			return func(ctx context.Context, a *app, args []string) int {
				arg, ok := a.oneRunArg("verify", args)
				if !ok {
					return exitUsage
				}
				if *key == "" {
					return a.usageError("verify", errors.New("--key is required: the PEM public key of the host that signed the run's attestation"))
				}
				v, err := attest.LoadVerifier(*key)
				if err != nil {
					return a.usageError("verify", fmt.Errorf("--key: %w", err))
				}
				return runVerify(ctx, a, f, arg, v, *jsonOut)
			}
		},
	})
}

// verifyReport is what `taskrun verify --json` prints.
type verifyReport struct {
	Run persist.RunRef `json:"run"`
	attest.Result
}

// runVerify verifies the attestation of the run named by arg, or in the
// envelope file arg.
func runVerify(ctx context.Context, a *app, f storedRunFlags, arg string, v *attest.Verifier, jsonOut bool) int {
	envelope, fromFile, err := readEnvelopeFile(arg)
	if err != nil {
		return a.usageError("verify", err)
	}
	var st *persist.Store
	var ref persist.RunRef
	if fromFile {
		if st, err = persist.Open(ctx, f.store); err != nil {
			fmt.Fprintf(a.stderr, "taskrun verify: --store: %v\n", err)
			return exitCannotRun
		}
		// The file names its run; the run's storage is where its
		// subjects must be.
		_, pred, perr := attest.ParseStatement(payloadOf(envelope))
		if perr == nil {
			id := pred.Run
			ref = persist.RunRef{UserID: id.UserID, ConversationID: id.ConversationID, TaskID: id.TaskID, RunID: id.RunID}
		}
		if f.user != "" {
			ref.UserID = f.user
		}
	} else {
		s, rec, code := f.openRun(ctx, a, "verify", arg)
		if code != exitOK {
			return code
		}
		st, ref = s, rec.Ref()
	}
	defer st.Close()
	res, err := verifyRun(ctx, st, ref, envelope, fromFile, v)
	if err != nil {
		return a.storeError("verify", err)
	}
	if jsonOut {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(verifyReport{Run: ref, Result: res}); err != nil {
			fmt.Fprintln(a.stderr, "taskrun verify:", err)
			return exitFailure
		}
	} else {
		printVerdict(a.stdout, ref, res)
	}
	if !res.Verified {
		return exitFailure
	}
	return exitOK
}

// readEnvelopeFile reads arg as an envelope file when it names one: a path
// with a separator or a .json name. Otherwise arg is a run ID.
func readEnvelopeFile(arg string) ([]byte, bool, error) {
	if !strings.ContainsRune(arg, os.PathSeparator) && !strings.HasSuffix(arg, ".json") {
		return nil, false, nil
	}
	data, err := os.ReadFile(arg)
	if err != nil {
		return nil, false, fmt.Errorf("read the envelope file: %w", err)
	}
	return data, true, nil
}

// payloadOf is the decoded payload of an envelope, or nil.
func payloadOf(envelope []byte) []byte {
	var env struct {
		Payload []byte `json:"payload"` // base64, decoded by encoding/json
	}
	if json.Unmarshal(envelope, &env) != nil {
		return nil
	}
	return env.Payload
}

// verifyRun verifies envelope (the run's stored one when not fromFile)
// against the run ref's stored objects.
func verifyRun(ctx context.Context, st *persist.Store, ref persist.RunRef, envelope []byte, fromFile bool, v *attest.Verifier) (attest.Result, error) {
	if !fromFile {
		var err error
		envelope, err = attest.ReadStored(ctx, st, ref)
		if errors.Is(err, attest.ErrNoEnvelope) {
			prefix, _ := persist.RunPrefix(ref)
			return attest.Result{Problems: []attest.Problem{{Kind: attest.ProblemMissing, Object: prefix + attest.ObjectName,
				Detail: "the run stored no attestation: it ran before attestations, or never started a container"}}}, nil
		}
		if err != nil {
			return attest.Result{}, err
		}
	}
	return attest.VerifyStored(ctx, st, ref, envelope, v)
}

// printVerdict writes the verdict for a person: one line, then every
// problem, then what the statement says of the run.
func printVerdict(w io.Writer, ref persist.RunRef, res attest.Result) {
	if res.Verified {
		fmt.Fprintf(w, "VERIFIED: run %s: signed by %s; all %d objects match\n", ref.RunID, res.KeyID, res.Checked)
	} else {
		fmt.Fprintf(w, "NOT VERIFIED: run %s: %d problem(s)\n", ref.RunID, len(res.Problems))
		for _, p := range res.Problems {
			fmt.Fprintf(w, "  %s\n", termsafe.String(p.String()))
		}
	}
	if p := res.Predicate; p != nil {
		fmt.Fprintf(w, "  statement: run %s, image %s (%s), runtime %s on %s, %s, exit %d\n",
			termsafe.String(p.Run.RunID), termsafe.String(p.Image.Ref), termsafe.String(p.Image.Digest),
			termsafe.String(p.Runtime), termsafe.String(p.Backend), p.Outcome.Status, p.Outcome.ExitCode)
		if iso := p.Isolation; iso != nil {
			fmt.Fprintf(w, "  isolation: audit %s, self-check %s\n", iso.Audit, iso.SelfCheck)
		}
		fmt.Fprintf(w, "  subjects: %d, matched: %d; executor %s %s\n", res.Subjects, res.Checked,
			termsafe.String(p.Executor.Version), termsafe.String(p.Executor.Hostname))
	}
}
