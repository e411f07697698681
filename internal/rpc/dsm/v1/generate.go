package dsmpb

// The Go code in this directory is generated from the .proto files beside it
// and checked in. After editing a .proto file, regenerate with
//
//	go generate ./internal/rpc/...
//
// which needs protoc (3.21 or later; apt-get install protobuf-compiler) and
// the two Go plugins, in $(go env GOPATH)/bin or on $PATH, at the versions
// the generated headers name:
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
//
// TestGeneratedUpToDate fails when the checked-in code differs from what the
// installed tools produce (it skips when they are missing).

//go:generate sh -c "PATH=$(go env GOPATH)/bin:$PATH exec protoc -I . --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative types.proto client.proto admin.proto"
