#include "common/tfevents_writer.h"

#include <array>
#include <ctime>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "dtrain/v1/tfevents.pb.h"

namespace dtrain {
namespace {

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // Castagnoli, reflected
    table[i] = c;
  }
  return table;
}

void PutLittleEndian(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t Crc32c(const char* data, size_t size) {
  static const std::array<uint32_t, 256> table = MakeTable();
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) {
    crc = table[(crc ^ static_cast<uint8_t>(data[i])) & 0xff] ^ (crc >> 8);
  }
  return crc ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(const char* data, size_t size) {
  const uint32_t crc = Crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

absl::StatusOr<std::unique_ptr<TfEventsWriter>> TfEventsWriter::Create(const std::string& dir,
                                                                       const std::string& host) {
  auto writer = std::unique_ptr<TfEventsWriter>(new TfEventsWriter());
  writer->path_ = absl::StrCat(dir, "/events.out.tfevents.", std::time(nullptr), ".", host);
  writer->out_.open(writer->path_, std::ios::binary | std::ios::trunc);
  if (!writer->out_) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create '", writer->path_, "'"));
  }
  v1::TfEvent version;
  version.set_wall_time(static_cast<double>(std::time(nullptr)));
  version.set_file_version("brain.Event:2");
  if (absl::Status s = writer->WriteRecord(version.SerializeAsString()); !s.ok()) return s;
  return writer;
}

absl::Status TfEventsWriter::AddScalar(const std::string& tag, double value, int64_t step,
                                       double wall_time) {
  v1::TfEvent event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  v1::TfSummaryValue* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  return WriteRecord(event.SerializeAsString());
}

absl::Status TfEventsWriter::WriteRecord(const std::string& data) {
  std::string header;
  PutLittleEndian(&header, data.size(), 8);
  std::string record = header;
  PutLittleEndian(&record, MaskedCrc32c(header.data(), header.size()), 4);
  record += data;
  PutLittleEndian(&record, MaskedCrc32c(data.data(), data.size()), 4);
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  if (!out_) return absl::DataLossError(absl::StrCat("cannot write to '", path_, "'"));
  return absl::OkStatus();
}

absl::Status TfEventsWriter::Flush() {
  out_.flush();
  return out_ ? absl::OkStatus() : absl::DataLossError(absl::StrCat("cannot write '", path_, "'"));
}

}  // namespace dtrain
