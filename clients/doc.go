// Package clients holds the end-to-end tests of taskrun's user API clients
// in other languages: the Python package under python/ and the TypeScript
// (ESM JavaScript with type declarations) package under typescript/. The
// tests start a real `taskrun serve` and `taskrun worker` and run each
// client's own test suite against them.
package clients
