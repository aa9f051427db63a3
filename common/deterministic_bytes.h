#ifndef VARIPIPE_COMMON_DETERMINISTIC_BYTES_H_
#define VARIPIPE_COMMON_DETERMINISTIC_BYTES_H_

#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message.h"

namespace varipipe {

// A message's binary serialization with map entries in key order, so equal
// messages give equal bytes (digests, write-once keys, plans compared byte
// for byte).
inline std::string DeterministicBytes(const google::protobuf::Message& message) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return bytes;
}

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_DETERMINISTIC_BYTES_H_
