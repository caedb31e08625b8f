package main

import "fmt"

// Greet returns the greeting for name.
// TODO: greet the person by name instead of the whole world.
func Greet(name string) string {
	return "Hello, world!"
}

func main() {
	fmt.Println(Greet("taskrun"))
}
