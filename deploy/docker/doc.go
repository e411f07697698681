// Package docker holds the container image of the DSM service (Dockerfile,
// Dockerfile.prebuilt) and its test, which builds the image with a real
// Docker daemon and runs a three-node cluster in containers. The package has
// no code: see docs/operations.md for how to build and run the image.
package docker
