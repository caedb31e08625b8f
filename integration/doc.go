// Package integration holds taskrun's end-to-end suites. They drive whole
// runs through taskrun.RunTask against the real Docker engine, with every
// collaborator real and out of process where it would be in production:
//
//   - the blob store is an S3 server (versitygw, built statically into a
//     local image and started with testcontainers-go);
//   - the control plane is a real HTTP server (workerclient/controlplanetest)
//     reached through workerclient's client and stream sender;
//   - the agent is the reference agent image, built from source, talking to
//     the scripted demo model through the run's gateway.
//
// Outcomes are checked where a user would see them: through the S3 API and
// in the control plane's records (PATCH bodies and reassembled stream bytes),
// never through taskrun's own return values.
//
// Every image is built locally with testcontainers' FromDockerfile (FROM
// scratch plus static binaries) under a per-session tag and removed at the
// end; nothing is pulled. Ryuk cannot be pulled either, so
// TESTCONTAINERS_RYUK_DISABLED defaults to true and the suite removes what it
// created itself.
//
// Run it with `go test ./integration/...` (a static busybox must be on PATH
// for the testbox image; apt-get install busybox-static). The helper package
// for other projects' suites is integration/taskruntest.
package integration
