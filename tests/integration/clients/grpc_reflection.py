"""grpc_reflection — a gRPC server reflection client for the tests, on
Debian's python3-grpcio and python3-protobuf only (no grpcio-reflection, no
generated stubs).

The reflection messages are built at run time from a FileDescriptorProto
written here from the public specification (doc/server-reflection.md and
grpc/reflection/v1/reflection.proto of the gRPC projects: message names and
field numbers), independently of the router's proto/reflection.proto, so a
wrong field number on the server side shows up as a failed test instead of
two copies agreeing with each other.

Used by tests/unit/test_grpc_grpcio.c (against the rt_grpc fixture) and
tests/integration/test_daemon_grpc_ext.py (against tangramd).

    r = Reflection(channel)                # or package="v1alpha"
    names = r.list_services()              # ["tangram.v1.Generation", ...]
    fds = r.file_containing_symbol("tangram.v1.Generation")
    pool = build_pool(fds)                 # a DescriptorPool of the files
    cls = message_class(pool, "tangram.v1.GenerateRequest")
"""
from google.protobuf import descriptor_pb2, descriptor_pool, text_format
from google.protobuf import message_factory

# The reflection messages, with the specification's field numbers. The
# package is filled in per protocol version (the wire form is the same).
_SPEC = """
name: "reflection_client_%(pkg)s.proto"
package: "grpc.reflection.%(pkg)s"
syntax: "proto3"
message_type {
  name: "ServerReflectionRequest"
  field { name: "host" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "file_by_filename" number: 3 label: LABEL_OPTIONAL
          type: TYPE_STRING oneof_index: 0 }
  field { name: "file_containing_symbol" number: 4 label: LABEL_OPTIONAL
          type: TYPE_STRING oneof_index: 0 }
  field { name: "file_containing_extension" number: 5 label: LABEL_OPTIONAL
          type: TYPE_MESSAGE oneof_index: 0
          type_name: ".grpc.reflection.%(pkg)s.ExtensionRequest" }
  field { name: "all_extension_numbers_of_type" number: 6
          label: LABEL_OPTIONAL type: TYPE_STRING oneof_index: 0 }
  field { name: "list_services" number: 7 label: LABEL_OPTIONAL
          type: TYPE_STRING oneof_index: 0 }
  oneof_decl { name: "message_request" }
}
message_type {
  name: "ExtensionRequest"
  field { name: "containing_type" number: 1 label: LABEL_OPTIONAL
          type: TYPE_STRING }
  field { name: "extension_number" number: 2 label: LABEL_OPTIONAL
          type: TYPE_INT32 }
}
message_type {
  name: "ServerReflectionResponse"
  field { name: "valid_host" number: 1 label: LABEL_OPTIONAL
          type: TYPE_STRING }
  field { name: "original_request" number: 2 label: LABEL_OPTIONAL
          type: TYPE_MESSAGE
          type_name: ".grpc.reflection.%(pkg)s.ServerReflectionRequest" }
  field { name: "file_descriptor_response" number: 4 label: LABEL_OPTIONAL
          type: TYPE_MESSAGE oneof_index: 0
          type_name: ".grpc.reflection.%(pkg)s.FileDescriptorResponse" }
  field { name: "all_extension_numbers_response" number: 5
          label: LABEL_OPTIONAL type: TYPE_MESSAGE oneof_index: 0
          type_name: ".grpc.reflection.%(pkg)s.ExtensionNumberResponse" }
  field { name: "list_services_response" number: 6 label: LABEL_OPTIONAL
          type: TYPE_MESSAGE oneof_index: 0
          type_name: ".grpc.reflection.%(pkg)s.ListServiceResponse" }
  field { name: "error_response" number: 7 label: LABEL_OPTIONAL
          type: TYPE_MESSAGE oneof_index: 0
          type_name: ".grpc.reflection.%(pkg)s.ErrorResponse" }
  oneof_decl { name: "message_response" }
}
message_type {
  name: "FileDescriptorResponse"
  field { name: "file_descriptor_proto" number: 1 label: LABEL_REPEATED
          type: TYPE_BYTES }
}
message_type {
  name: "ExtensionNumberResponse"
  field { name: "base_type_name" number: 1 label: LABEL_OPTIONAL
          type: TYPE_STRING }
  field { name: "extension_number" number: 2 label: LABEL_REPEATED
          type: TYPE_INT32 }
}
message_type {
  name: "ListServiceResponse"
  field { name: "service" number: 1 label: LABEL_REPEATED type: TYPE_MESSAGE
          type_name: ".grpc.reflection.%(pkg)s.ServiceResponse" }
}
message_type {
  name: "ServiceResponse"
  field { name: "name" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
}
message_type {
  name: "ErrorResponse"
  field { name: "error_code" number: 1 label: LABEL_OPTIONAL
          type: TYPE_INT32 }
  field { name: "error_message" number: 2 label: LABEL_OPTIONAL
          type: TYPE_STRING }
}
"""


def message_class(pool, full_name):
    """The Python class of message `full_name` in `pool`."""
    desc = pool.FindMessageTypeByName(full_name)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


def build_pool(files):
    """A DescriptorPool holding the serialized FileDescriptorProtos `files`
    (any order; each file is added after the files it imports). Raises
    ValueError when a file imports one that is not given."""
    protos = {}
    for raw in files:
        fdp = descriptor_pb2.FileDescriptorProto.FromString(raw)
        protos[fdp.name] = fdp
    pool = descriptor_pool.DescriptorPool()
    added = set()

    def add(name, stack=()):
        if name in added:
            return
        if name not in protos or name in stack:
            raise ValueError("file %s is missing or imports itself" % name)
        for dep in protos[name].dependency:
            add(dep, stack + (name,))
        pool.Add(protos[name])
        added.add(name)

    for name in protos:
        add(name)
    return pool


class Reflection:
    """ServerReflectionInfo over `channel` (grpcio). Each method opens one
    bidirectional call, sends its requests and returns the responses (one
    per request); `metadata` goes with every call."""

    def __init__(self, channel, package="v1", metadata=None, timeout=30):
        pool = descriptor_pool.DescriptorPool()
        pool.Add(text_format.Parse(_SPEC % {"pkg": package},
                                   descriptor_pb2.FileDescriptorProto()))
        prefix = "grpc.reflection.%s." % package
        self.Request = message_class(pool, prefix + "ServerReflectionRequest")
        self.Response = message_class(pool, prefix +
                                      "ServerReflectionResponse")
        self.ExtensionRequest = message_class(pool, prefix +
                                              "ExtensionRequest")
        self.call = channel.stream_stream(
            "/grpc.reflection.%s.ServerReflection/ServerReflectionInfo" %
            package,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=self.Response.FromString)
        self.metadata = metadata
        self.timeout = timeout

    def ask(self, requests):
        """Sends the requests on one stream; returns the responses."""
        return list(self.call(iter(requests), metadata=self.metadata,
                              timeout=self.timeout))

    def list_services(self):
        resp = self.ask([self.Request(host="h", list_services="")])[0]
        return [s.name for s in resp.list_services_response.service]

    def _files(self, resp):
        which = resp.WhichOneof("message_response")
        if which != "file_descriptor_response":
            raise LookupError("%s: %s" % (
                which, resp.error_response.error_code
                if which == "error_response" else ""))
        return list(resp.file_descriptor_response.file_descriptor_proto)

    def file_containing_symbol(self, symbol):
        """The serialized files (the declaring one first); LookupError
        when the server answers with an error_response."""
        return self._files(self.ask([self.Request(
            file_containing_symbol=symbol)])[0])

    def file_by_filename(self, name):
        return self._files(self.ask([self.Request(
            file_by_filename=name)])[0])
