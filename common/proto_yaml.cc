#include "common/proto_yaml.h"

#include "common/yaml_float.h"

namespace dtrain {

using google::protobuf::FieldDescriptor;

bool EmitScalarField(YAML::Emitter& out, const google::protobuf::Message& message,
                     const FieldDescriptor* field, int index) {
  const google::protobuf::Reflection* r = message.GetReflection();
  const bool repeated = field->is_repeated();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return false;
    case FieldDescriptor::CPPTYPE_INT32:
      out << (repeated ? r->GetRepeatedInt32(message, field, index) : r->GetInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      out << (repeated ? r->GetRepeatedInt64(message, field, index) : r->GetInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      out << (repeated ? r->GetRepeatedUInt32(message, field, index)
                       : r->GetUInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      out << (repeated ? r->GetRepeatedUInt64(message, field, index)
                       : r->GetUInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      out << YamlFloat(repeated ? r->GetRepeatedDouble(message, field, index)
                                : r->GetDouble(message, field));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      out << YamlFloat(repeated ? r->GetRepeatedFloat(message, field, index)
                                : r->GetFloat(message, field));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      out << ((repeated ? r->GetRepeatedBool(message, field, index) : r->GetBool(message, field))
                  ? "true"
                  : "false");
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      out << (repeated ? r->GetRepeatedEnum(message, field, index) : r->GetEnum(message, field))
                 ->name();
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      out << YAML::DoubleQuoted
          << (repeated ? r->GetRepeatedString(message, field, index)
                       : r->GetString(message, field));
      break;
  }
  return true;
}

}  // namespace dtrain
