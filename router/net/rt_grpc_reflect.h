/*
 * rt_grpc_reflect.h — gRPC server reflection on rt_grpc (the protocol of
 * doc/server-reflection.md in the gRPC repository; messages in
 * proto/reflection.proto), so that clients such as grpcurl can list the
 * services and fetch their descriptors without the .proto files.
 *
 * Serves "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo" and
 * "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo" (the
 * same messages), bidirectional: each request message is answered by one
 * response message, in order, until the client half-closes (then OK).
 * - list_services: the services of the server's method table, each once,
 *   in registration order (reflection itself and health included).
 * - file_by_filename / file_containing_symbol: the serialized
 *   FileDescriptorProto of that file followed by those of every file it
 *   imports, transitively (each once). A symbol is any fully qualified
 *   name a file declares: service, method ("pkg.Service.Method"), message
 *   (nested ones too), field, oneof, enum, enum value (in the scope that
 *   contains its enum, as protobuf scopes them) or extension.
 * - file_containing_extension: the file declaring that extension;
 *   all_extension_numbers_of_type: the extension numbers declared for a
 *   known message type (none is an empty list).
 * - Unknown names: an error_response with 5 NOT_FOUND; a request with no
 *   question: 3 INVALID_ARGUMENT; the stream goes on either way. A message
 *   that does not parse ends the call with INVALID_ARGUMENT, and a client
 *   that stops reading while asking more (over 4 MiB of answers queued)
 *   with RESOURCE_EXHAUSTED.
 *
 * Threading: the loop thread of the server, like all of rt_grpc.
 */
#ifndef RT_GRPC_REFLECT_H
#define RT_GRPC_REFLECT_H

#include <stddef.h>
#include <stdint.h>

#include "router/net/rt_grpc.h"

/* Registers both reflection methods on `srv`, indexing `set` (len bytes):
 * a serialized google.protobuf.FileDescriptorSet holding every file to
 * serve and everything those files import (protoc --descriptor_set_out
 * --include_imports). The bytes are copied. Returns 0, TG_EFORMAT (the set
 * or a file in it does not parse, or imports a file it lacks; detail in
 * err), TG_EEXIST (registered already, or a method path taken) or
 * TG_ENOMEM. The server owns the index and frees it in
 * rt_grpc_server_free(). Loop thread. */
int rt_grpc_reflect_register(struct rt_grpc_server *srv, const uint8_t *set,
                             size_t len, char *err, size_t errlen);

#endif /* RT_GRPC_REFLECT_H */
