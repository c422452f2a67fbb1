// StateDictChunks: a state dict as StreamStateDict's messages, each under gRPC's default limit.
#include "worker/service/state_dict_stream.h"

#include <gtest/gtest.h>

#include <string>

#include "common/streaming.h"

namespace dtrain {
namespace state_dict_stream_test {

v1::Tensor TensorOf(size_t bytes, char fill, int64_t rows) {
  v1::Tensor t;
  t.mutable_meta()->set_dtype(v1::DTYPE_FLOAT32);
  t.mutable_meta()->add_shape(rows);
  t.set_data(std::string(bytes, fill));
  return t;
}

// Names in order; a tensor larger than a chunk splits at kStreamChunkBytes, its meta only in its
// first chunk, and the chunks' bytes join back to the tensor's; an empty tensor is one chunk.
TEST(StateDictStream, Chunks_InNameOrder_SplitAtTheLimit_MetaFirst_BytesJoinBack) {
  const size_t big = static_cast<size_t>(kStreamChunkBytes) * 2 + 17;
  v1::StateDictResponse dict;
  (*dict.mutable_tensors())["weight"] = TensorOf(big, 'w', 3);
  (*dict.mutable_tensors())["bias"] = TensorOf(8, 'b', 2);
  (*dict.mutable_tensors())["empty"] = TensorOf(0, 'e', 0);

  const std::vector<v1::StateDictChunk> chunks = StateDictChunks(dict);
  ASSERT_EQ(chunks.size(), 5u);  // bias, empty, weight x 3
  EXPECT_EQ(chunks[0].name(), "bias");
  EXPECT_EQ(chunks[0].data(), std::string(8, 'b'));
  EXPECT_EQ(chunks[0].meta().shape(0), 2);
  EXPECT_EQ(chunks[1].name(), "empty");
  EXPECT_TRUE(chunks[1].has_meta());
  EXPECT_EQ(chunks[1].data(), "");
  std::string joined;
  for (size_t i = 2; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].name(), "weight");
    EXPECT_EQ(chunks[i].has_meta(), i == 2) << i;
    EXPECT_LE(chunks[i].data().size(), static_cast<size_t>(kStreamChunkBytes));
    joined += chunks[i].data();
  }
  EXPECT_EQ(chunks[2].meta().shape(0), 3);
  EXPECT_EQ(chunks[4].data().size(), 17u);
  EXPECT_EQ(joined, std::string(big, 'w'));
  EXPECT_EQ(dict.tensors().at("weight").data().size(), big);  // the dict is left whole
}

}  // namespace state_dict_stream_test
}  // namespace dtrain
