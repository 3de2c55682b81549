/* String handling: length, reverse in place, upper-casing, word count and substring search. */
static int length(const char *s) {
    int n = 0;
    while (s[n])
        n++;
    return n;
}

static void reverse(char *s) {
    for (int i = 0, j = length(s) - 1; i < j; i++, j--) {
        char t = s[i];
        s[i] = s[j];
        s[j] = t;
    }
}

static void to_upper(char *s) {
    for (; *s; s++)
        if (*s >= 'a' && *s <= 'z')
            *s = (char)(*s - 'a' + 'A');
}

static int count_words(const char *s) {
    int words = 0, inside = 0;
    for (; *s; s++) {
        int space = *s == ' ' || *s == '\t' || *s == '\n';
        if (!space && !inside)
            words++;
        inside = !space;
    }
    return words;
}

static int find(const char *hay, const char *needle) {
    int n = length(hay), m = length(needle);
    for (int i = 0; i + m <= n; i++) {
        int j = 0;
        while (j < m && hay[i + j] == needle[j])
            j++;
        if (j == m)
            return i;
    }
    return -1;
}

int main(void) {
    char text[] = "the quick brown fox jumps over the lazy dog";
    int words = count_words(text);
    int at = find(text, "lazy");
    reverse(text);
    to_upper(text);
    return words + at + (text[0] == 'G');
}
