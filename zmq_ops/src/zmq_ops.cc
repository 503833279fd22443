// The ZMQConnection and ZMQPull ops: tensors from a ZMQ PULL socket.
//
// Op names, inputs and attributes match tensorpack/zmq_ops, so its Python
// wrappers and tensorpack's ZMQInput work unchanged; timeout_ms and
// max_msg_size are additions with defaults that keep the old behaviour.

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_op_kernel.h"
#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "wire_decode.h"
#include "zmq_connection.h"

// Lets the build script tell which TensorFlow this library was built for
// without loading it (see zmq_ops/build.py).
#ifndef ZMQ_OPS_BUILD_STAMP
#define ZMQ_OPS_BUILD_STAMP "unknown"
#endif
extern "C" __attribute__((used, visibility("default"))) const char feedbench_zmq_ops_build_stamp[] =
    "feedbench-zmq-ops-stamp:" ZMQ_OPS_BUILD_STAMP;

namespace feedbench {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::DataType;
using tensorflow::DataTypeString;
using tensorflow::DataTypeVector;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace errors = tensorflow::errors;

// A tensor's buffer that is a published shared-memory slot: the op's output
// without a copy. Every output tensor of one batch shares the slot's lease;
// the slot goes back to its producer when TensorFlow drops the last of them.
class SlotBuffer : public tensorflow::TensorBuffer {
 public:
  SlotBuffer(char* data, size_t size, std::shared_ptr<shm::SlotLease> lease)
      : TensorBuffer(data), size_(size), lease_(std::move(lease)) {}
  size_t size() const override { return size_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(size_));
    proto->set_allocator_name("feedbench_shm_slot");
  }
  bool OwnsMemory() const override { return false; }

 private:
  ~SlotBuffer() override = default;
  const size_t size_;
  std::shared_ptr<shm::SlotLease> lease_;
};

// Creates the connection once per (container, shared_name); later runs of
// the op, and other graphs sharing the name, get the same socket.
class ZmqConnectionOp : public tensorflow::ResourceOpKernel<ZmqConnection> {
 public:
  explicit ZmqConnectionOp(OpKernelConstruction* ctx) : ResourceOpKernel<ZmqConnection>(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("end_point", &options_.end_point));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("hwm", &options_.hwm));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bind", &options_.bind));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_ms", &options_.timeout_ms));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_msg_size", &options_.max_msg_size));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("curve_keys", &options_.curve_keys_dir));
  }

 private:
  absl::Status CreateResource(ZmqConnection** ret) override TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ZmqConnection::Create(options_, ret);
  }

  // Two ops sharing a name must mean the same socket.
  absl::Status VerifyResource(ZmqConnection* conn) override {
    const ConnectionOptions& o = conn->options();
    if (o.end_point != options_.end_point || o.bind != options_.bind ||
        o.curve_keys_dir != options_.curve_keys_dir) {
      return absl::InvalidArgumentError(absl::StrCat("shared ZMQ connection ", conn->DebugString(),
                                                     " cannot be reused for ", options_.end_point,
                                                     options_.bind ? " (bind)" : " (connect)"));
    }
    return absl::OkStatus();
  }

  ConnectionOptions options_;
};

// Receives one message and turns it into the op's outputs. The blocking
// receive runs on the connection's own threads (see ZmqConnection).
class ZmqPullOp : public AsyncOpKernel {
 public:
  explicit ZmqPullOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("types", &types_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("zero_copy", &zero_copy_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    ZmqConnection* conn = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &conn), done);
    // The closure holds no reference: ~ZmqConnection drains the pool before
    // it frees anything, and dropping the last reference on a pool thread
    // would make the pool wait for itself.
    tensorflow::core::ScopedUnref unref(conn);
    conn->Schedule([this, ctx, conn, done = std::move(done)]() {
      ctx->SetStatus(Pull(ctx, conn));
      done();
    });
  }

 private:
  absl::Status Pull(OpKernelContext* ctx, ZmqConnection* conn) {
    const std::string& ep = conn->options().end_point;
    Message msg;
    TF_RETURN_IF_ERROR(conn->Receive(&msg, ctx->cancellation_manager()));

    // Socket lock released: check the decoded message and copy it out while
    // other pulls receive.
    if (!msg.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("bad ", msg.native() ? "native" : "zmq_ops", " message from ",
                                                     ep, ": ", msg.error().ToString()));
    }
    std::vector<wire::TensorView> tensors = msg.tensors();
    // A shared-memory slot goes back to its producer after the copy, or, when
    // the outputs are the slot, once TensorFlow has dropped all of them.
    auto lease = std::make_shared<shm::SlotLease>();
    wire::WireError werr;
    if (!conn->core().ResolveSlot(msg, &tensors, lease.get(), &werr)) {
      return absl::InvalidArgumentError(absl::StrCat("bad slot message from ", ep, ": ", werr.ToString()));
    }
    if (tensors.size() != types_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("n_tensors: message from ", ep, " has ", tensors.size(),
                                                     " tensors, the op expects ", types_.size(), " (",
                                                     tensorflow::DataTypeVectorString(types_), ")"));
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      const DataType got = static_cast<DataType>(tensors[i].dtype);
      if (got != types_[i]) {
        return absl::InvalidArgumentError(absl::StrCat("tensor[", i, "].dtype: message from ", ep, " has ",
                                                       DataTypeString(got), ", the op expects ",
                                                       DataTypeString(types_[i])));
      }
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      const wire::TensorView& t = tensors[i];
      TensorShape shape;
      absl::Status s = TensorShape::BuildTensorShape(t.shape, &shape);
      if (!s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("tensor[", i, "].shape: message from ", ep, ": ", s.message()));
      }
      if (types_[i] == tensorflow::DT_STRING) {  // byte strings: each copied into a tstring of its own
        Tensor* out = nullptr;
        TF_RETURN_IF_ERROR(ctx->allocate_output(static_cast<int>(i), shape, &out));
        auto flat = out->flat<tensorflow::tstring>();
        size_t at = 8 * static_cast<size_t>(flat.size());  // the decoder checked the table against the frame
        for (int64_t k = 0; k < flat.size(); ++k) {
          uint64_t len = 0;
          std::memcpy(&len, t.data + 8 * k, 8);
          flat(k).assign(t.data + at, len);
          at += len;
        }
        continue;
      }
      const bool aligned = reinterpret_cast<uintptr_t>(t.data) % EIGEN_MAX_ALIGN_BYTES == 0;
      if (zero_copy_ && lease->held() && t.nbytes > 0 && types_[i] != tensorflow::DT_BOOL && aligned) {
        auto* buf = new SlotBuffer(const_cast<char*>(t.data), t.nbytes, lease);
        Tensor slot_tensor(types_[i], shape, buf);  // takes its own reference
        buf->Unref();
        ctx->set_output(static_cast<int>(i), slot_tensor);
        continue;
      }
      // Pinned host memory where TensorFlow has a GPU (its GPU-compatible host allocator), so the copy to a
      // tower's GPU is a DMA from it, not staged through a bounce buffer; plain host memory without one.
      tensorflow::AllocatorAttributes pinned;
      pinned.set_on_host(true);
      pinned.set_gpu_compatible(true);
      Tensor* out = nullptr;
      TF_RETURN_IF_ERROR(ctx->allocate_output(static_cast<int>(i), shape, &out, pinned));
      if (t.nbytes == 0) continue;
      char* dst = static_cast<char*>(out->data());
      if (types_[i] == tensorflow::DT_BOOL) {
        // Any byte other than 0 or 1 would be an invalid C++ bool.
        for (size_t k = 0; k < t.nbytes; ++k) dst[k] = t.data[k] != 0;
      } else {
        std::memcpy(dst, t.data, t.nbytes);  // the one copy: ZMQ's buffer -> tensor
      }
    }
    return absl::OkStatus();
  }

  DataTypeVector types_;
  bool zero_copy_ = true;
};

// Reads the connection's counters: what arrived from whom, what went missing.
class ZmqConnectionStatsOp : public OpKernel {
 public:
  explicit ZmqConnectionStatsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    ZmqConnection* conn = nullptr;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &conn));
    tensorflow::core::ScopedUnref unref(conn);
    const auto counts = conn->core().ProducerCounts();
    Tensor* producers = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({static_cast<int64_t>(counts.size()), 5}), &producers));
    auto rows = producers->matrix<int64_t>();
    int64_t r = 0;
    for (const auto& [id, c] : counts) {
      rows(r, 0) = id;
      rows(r, 1) = c.received;
      rows(r, 2) = c.lost;
      rows(r, 3) = c.duplicated;
      rows(r, 4) = c.restarts;
      ++r;
    }
    Tensor* totals = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({2}), &totals));
    conn->core().Totals(&totals->vec<int64_t>()(0), &totals->vec<int64_t>()(1));
  }
};

REGISTER_KERNEL_BUILDER(Name("ZMQConnection").Device(tensorflow::DEVICE_CPU), ZmqConnectionOp);
REGISTER_KERNEL_BUILDER(Name("ZMQConnectionStats").Device(tensorflow::DEVICE_CPU), ZmqConnectionStatsOp);
REGISTER_KERNEL_BUILDER(Name("ZMQPull").Device(tensorflow::DEVICE_CPU), ZmqPullOp);

}  // namespace
}  // namespace feedbench

REGISTER_OP("ZMQConnection")
    .Output("handle: resource")
    .Attr("end_point: string")
    .Attr("hwm: int >= 1 = 10")
    .Attr("bind: bool = true")
    .Attr("timeout_ms: int = -1")
    .Attr("max_msg_size: int = -1")
    .Attr("curve_keys: string = ''")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
A ZMQ PULL socket, as a resource shared by the ZMQPull ops that use it.

end_point: the ZMQ endpoint (ipc://PATH, tcp://HOST:PORT), or shm://NAME for
  batches in producers' shared-memory slots (docs/wire.md).
hwm: receive high-water mark, in messages.
bind: bind to the endpoint (true) or connect to it (false).
timeout_ms: a pull that gets no message in this time fails with
  DeadlineExceeded; -1 waits forever.
max_msg_size: ZMQ_MAXMSGSIZE, the largest frame a peer may send before it is
  disconnected; -1 is unlimited.
curve_keys: a folder made by `python -m producers make-keys`: encrypt with
  CURVE and, when binding, admit only producers whose public key is in it.
  Empty: no encryption.
)doc");

REGISTER_OP("ZMQConnectionStats")
    .Input("handle: resource")
    .Output("producers: int64")
    .Output("totals: int64")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Matrix(c->UnknownDim(), 5));
      c->set_output(1, c->Vector(2));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Counters of a ZMQConnection: what its pulls accepted, and from whom.

producers: one row per producer id seen in native headers:
  (producer_id, received, lost, duplicated, restarts), from sequence numbers.
totals: (messages, bytes) over every accepted message of either format.
)doc");

REGISTER_OP("ZMQPull")
    .Input("handle: resource")
    .Output("output: types")
    .Attr("types: list(type) >= 0")
    .Attr("zero_copy: bool = true")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::UnknownShape)
    .Doc(R"doc(
Receives one message from a ZMQConnection and returns its tensors.

Accepts the single-frame zmq_ops format and feedbench's native multipart
format (docs/wire.md). From shm:// producers, with zero_copy, each output's
buffer is the producer's slot itself (no copy): the slot is handed back when
TensorFlow drops the last output of that batch. zero_copy=false copies each
batch into fresh tensors and hands the slot back at once. A malformed message, or one whose tensor count or
dtypes differ from `types`, fails the step with InvalidArgument naming the
offending field; the connection stays usable.
)doc");
