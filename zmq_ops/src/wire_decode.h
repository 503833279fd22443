// Decoders for the two wire formats the ZMQPull op accepts.
//
// Both formats are specified in docs/wire.md (Python reference decoders:
// wire/zmqops_format.py and wire/native.py). The decoders here never trust a
// byte from the wire: every count, length and dimension is checked before it
// is used, and a bad message yields a WireError naming the same field the
// Python decoders name. Nothing here allocates tensor memory; the decoded
// views point into the received frames.
//
// This file does not depend on TensorFlow, so it stays small and quick to
// compile; dtype codes are TensorFlow's DataType enum values.

#ifndef FEEDBENCH_ZMQ_OPS_WIRE_DECODE_H_
#define FEEDBENCH_ZMQ_OPS_WIRE_DECODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace feedbench {
namespace wire {

constexpr int kMaxTensors = 1024;  // both formats
constexpr int kMaxNdim = 8;        // both formats
constexpr char kNativeMagic[4] = {'F', 'B', 'W', 'N'};
constexpr char kSlotMagic[4] = {'F', 'B', 'W', 'S'};  // a shared-memory slot message (shm.h)
constexpr uint16_t kNativeVersion = 1;
constexpr size_t kNativeFixedSize = 32;  // magic .. extras_len
// A batch of byte strings (TensorFlow's DT_STRING; native format only): shape [n], its frame a
// uint64 length table of n entries, then the strings back to back (wire/strings.py).
constexpr int kBytesDtype = 7;

// One received frame: a view of bytes owned by a zmq_msg_t.
struct Frame {
  const char* data;
  size_t size;
};

// One decoded tensor: its dtype code, shape, and a view of its raw bytes.
struct TensorView {
  int dtype = 0;
  std::vector<int64_t> shape;
  const char* data = nullptr;
  size_t nbytes = 0;
};

// What the native header says besides the tensor descriptors.
struct NativeHeader {
  uint32_t producer_id = 0;
  uint64_t seq = 0;
  int64_t send_time_ns = 0;
};

// Why a message was rejected: `field` is one of n_tensors, tensor[i].dtype,
// tensor[i].ndim, tensor[i].shape, tensor[i].shape[j], tensor[i].nbytes,
// tensor[i].data, tensor[i].lengths (a byte-string tensor's length table), message, header, magic,
// version, frames, extras_len.
struct WireError {
  std::string field;
  std::string message;
  std::string ToString() const { return field + ": " + message; }
};

// Size in bytes of one element of a wire dtype code, or 0 if unknown.
size_t ItemSize(int dtype);
// numpy's name for a wire dtype code ("uint8", "float32", ...), for messages.
const char* DtypeName(int dtype);

// True when the message must be read as the native format: more than one
// frame, or a first frame that starts with the magic.
bool IsNative(const std::vector<Frame>& frames);

// The single-frame zmq_ops format. Returns false and fills `err` if invalid.
bool DecodeZmqOps(const Frame& frame, std::vector<TensorView>* out, WireError* err);

// The native multipart format. `total_frames` may exceed frames.size() when
// the receiver dropped frames beyond what any valid message could have.
bool DecodeNative(const std::vector<Frame>& frames, size_t total_frames, NativeHeader* header,
                  std::vector<TensorView>* out, WireError* err);

// Frame 0 of the native format (or of a slot message, with kSlotMagic):
// header fields and the tensor descriptors (dtype, shape; no data yet).
bool DecodeNativeHeader(const Frame& frame, const char* magic, NativeHeader* header, std::vector<TensorView>* out,
                        WireError* err);

// Bytes a tensor of t.dtype and t.shape holds; false if no array can be that large.
bool TensorBytes(const TensorView& t, uint64_t* nbytes);

// Either format, chosen by IsNative(). `header` is filled for native only.
bool DecodeMessage(const std::vector<Frame>& frames, size_t total_frames, bool* is_native,
                   NativeHeader* header, std::vector<TensorView>* out, WireError* err);

}  // namespace wire
}  // namespace feedbench

#endif  // FEEDBENCH_ZMQ_OPS_WIRE_DECODE_H_
