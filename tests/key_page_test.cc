// KeyPage: the paging of ListWorkers, ListGroups and KeyValueList (page sizes, byte budgets,
// tokens that resume after a key of any bytes, refusals that name the field).
#include "common/key_page.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <string>

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(KeyPage, PageSize_BoundsTheEntries_TheTokenResumesAfterTheLastTaken) {
  absl::StatusOr<KeyPage> page = KeyPage::Parse(2, "", 1 << 20);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_FALSE(page->resumes());
  EXPECT_TRUE(page->Take("a", 10));
  EXPECT_TRUE(page->Take("b", 10));
  EXPECT_FALSE(page->Take("c", 10));
  const std::string token = page->next_page_token();
  ASSERT_FALSE(token.empty());
  absl::StatusOr<KeyPage> next = KeyPage::Parse(2, token, 1 << 20);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(next->resumes());
  EXPECT_EQ(next->after(), "b");
}

TEST(KeyPage, ALastPageExactlyFull_HasNoToken) {
  absl::StatusOr<KeyPage> page = KeyPage::Parse(2, "", 1 << 20);
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->Take("a", 10));
  EXPECT_TRUE(page->Take("b", 10));
  EXPECT_EQ(page->next_page_token(), "");  // nothing was refused: the listing ended
}

TEST(KeyPage, Bytes_BoundTheEntriesTogether_TheFirstAlwaysFits) {
  absl::StatusOr<KeyPage> page = KeyPage::Parse(0, "", 100);
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->Take("huge", 150));  // else a page could never hold it
  EXPECT_FALSE(page->Take("next", 1));
  absl::StatusOr<KeyPage> second = KeyPage::Parse(0, page->next_page_token(), 100);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->after(), "huge");
  EXPECT_TRUE(second->Take("a", 60));
  EXPECT_TRUE(second->Take("b", 40));
  EXPECT_FALSE(second->Take("c", 1));
  EXPECT_EQ(KeyPage::Parse(0, second->next_page_token(), 100)->after(), "b");
}

TEST(KeyPage, AKeyOfAnyBytes_SurvivesItsToken) {
  const std::string key("k\0\xff\xfe/+=", 7);
  absl::StatusOr<KeyPage> page = KeyPage::Parse(1, "", 1 << 20);
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->Take(key, 1));
  EXPECT_FALSE(page->Take("z", 1));
  const std::string token = page->next_page_token();
  // A proto string must be UTF-8; the token is web-safe base64, plain ASCII.
  for (char c : token)
    EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') << token;
  EXPECT_EQ(KeyPage::Parse(1, token, 1 << 20)->after(), key);
}

TEST(KeyPage, NegativeSizesAndForeignTokens_RefusedNamingTheField_NotEchoed) {
  absl::StatusOr<KeyPage> negative = KeyPage::Parse(-1, "", 1 << 20);
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.status().message(),
              HasSubstr("page_size must be >= 0 (0: as many as fit), got -1"));
  for (const std::string& token :
       {std::string("not base64!"), std::string(kMostPageTokenBytes + 4, 'A')}) {
    absl::StatusOr<KeyPage> foreign = KeyPage::Parse(0, token, 1 << 20);
    EXPECT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument) << token.size();
    EXPECT_THAT(foreign.status().message(),
                HasSubstr("is not one this service gave; pass next_page_token as is"));
    EXPECT_THAT(foreign.status().message(), Not(HasSubstr(token.substr(0, 8))));
  }
}

}  // namespace
}  // namespace dtrain::testing
